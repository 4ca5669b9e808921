"""Reports: plots, Markdown, and Chrome/Perfetto traces rendered from results (the runs behind
them are sim.experiments; no module here imports the engine, the runner, the costs or the lowering)."""
