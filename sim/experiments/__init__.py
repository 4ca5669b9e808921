"""Experiments: the runs behind the reports, returning plain result records.

Each module here drives ``sim.run`` (and, where a report needs a piece of the pipeline
alone, the lowering, the costs or the engine) and returns dataclasses, dicts or rows;
``sim.report`` renders those records to Markdown and figures and runs nothing itself.
"""
