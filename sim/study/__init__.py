"""What-if studies: YAML base + overrides + sweeps -> many independent runs.

``load_study(name_or_path)`` reads and checks a study; ``run_study(study, out_dir)`` runs
it (cached, resumable, local processes or Dask) and returns a ``StudyResult`` whose
``.table`` is the tidy results DataFrame; ``results(out_dir)`` reads a saved table back.
"""

from sim.study.runner import StudyResult, content_hash, results, run_study, simulator_version
from sim.study.spec import Point, Study, StudySpec, load_study

__all__ = ["load_study", "run_study", "results", "content_hash", "simulator_version", "Study", "StudySpec",
           "StudyResult", "Point"]
