"""The running process: uvicorn (`serve`), graceful shutdown (`graceful`: the server;
`drain`: the app's shutdown state and requests in flight), and connection limits
(`connections`)."""
