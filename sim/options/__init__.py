"""The command-line options that both front ends parse: the CLI (sim.commands) and the
what-if explorer (sim.explore), which turns its form into a ``decodesim run`` or
``decodesim serve`` argument list and parses it with these same options.

They sit below both, so neither front end imports the other for them: ``run`` (the run
options of run, compare and solve, the run command's outputs, the output-path argparse
types), ``serve`` (the serve command's options) and ``spec`` (the RunSpec the run options ask
for). ``run`` and ``serve`` are imported on every start to build the parser, so they stay
light (no pydantic); ``spec`` loads the validation stack.
"""
