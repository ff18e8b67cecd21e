"""The commands: each registers its parser (``add_parser``) and runs from it (``run``),
and ``vnetd.cli`` composes them (``vnetd.cli.commands``).

One module each: ``up``, ``register``, ``address_plan`` (``vnetd plan``),
``provision``, ``signing_key`` (``vnetd signing-key``) and ``demo``. A package each
where the command has parts: ``render`` (``vnetd render KIND`` and ``vnetd
hosts``), ``status``, ``wait`` and ``doctor``, whose pure parts (renderers, views,
the wait gate, the doctor's causes) are the packages of the same name in the views
layer (docs/architecture.md, "Module map").

Nothing is imported here: ``vnetd up`` imports ``commands.up`` alone.
"""
