"""HTTP plumbing every route shares: the API specs (`apis`), dependencies (`deps`: the
caller, the model; `lease`: the model a route's body names, loaded; `management`: who may
manage models), the key before the body (`key_first`), body limits (`bodies`), the
access and origin middleware (`middleware`) and the app's drain state (`drain`). The
errors they raise and render are server/errors.py's."""
