"""What each subcommand does, one module per command (``handle(args) -> exit status``).

sim.cli imports a handler module only when its command runs (the parser modules in
sim.commands name it), so each one imports the simulator stack it needs at its top.
"""
