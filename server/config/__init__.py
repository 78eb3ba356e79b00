"""Configuration: the settings tree (`tree`), the `[[models]]` entries
(`model_entries`), where values come from (`sources`), how they are read (`values`), and
what is masked when settings are shown (`mask`)."""
