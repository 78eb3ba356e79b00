"""HTTP plumbing every route shares: dependencies (`deps`: the caller, the model),
errors and their wire shapes (`errors`), the sampling record (`sampling`), the body
limit and access middleware (`middleware`), and the origin guard (`origins`)."""
