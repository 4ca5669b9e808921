"""Reports: plots, Markdown, and Chrome/Perfetto traces built from result tables."""
