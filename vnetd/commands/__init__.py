"""The one-module commands: ``up``, ``register``, ``address_plan`` (``vnetd plan``) and
``demo``. Each registers its parser (``add_parser``) and runs from it (``run``);
``vnetd.cli`` composes them with the commands that have packages of their own
(``render``, ``status``, ``wait``).
"""
