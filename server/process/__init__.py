"""The running process: uvicorn (`serve`), graceful shutdown (`graceful`), and connection
limits (`connections`). It sits above the app it runs: the app's own shutdown state and
requests in flight (`Lifecycle`) are server/http/drain.py's, so the app never imports
this package."""
