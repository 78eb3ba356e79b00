"""The `kvserve` command: flags and settings (`main`), the model commands
(`manage`: pull, ls, ps, rm, run), the chat loop of `run` (`chat`), and their HTTP and
text helpers (`http`, `text`)."""
