"""The serving core every API shares: request -> plan -> engine -> per-choice state -> events.

- `prepare`: chat messages and options -> the plan (prompt, grammar, parser) and the
  engine requests; template and tool errors become 400s naming the field.
- `drive`: run a `Generation` to its end or as increments; disconnect -> abort, then
  ClientDisconnected, which server/errors.py answers once for every API (499).
- `state`: one choice's accumulated result and its incremental parse state, and the
  parsed output (content, reasoning, tool calls) every API reads its answer from.
- `engine_requests`: a request's sampling as a plain frozen record (the engine's
  SamplingParams, converted once by the protocol model: pydantic stops there; and `n`,
  `stop`, the session, the salt, the adapters), and that record and a prompt -> the
  engine requests, each built once.
- `events`: increments -> parsed steps per choice (content, reasoning, complete calls,
  the finish), which each API adapter turns into its own shapes.
- `sse`: the wire framing of every stream (data lines, named events, [DONE], error tail).
- `prompts`: raw prompts (strings, token ids) -> token lists, for completions/embeddings.

The API packages (`server/api/<api>/`: router, protocol, serving) sit on top.
"""
