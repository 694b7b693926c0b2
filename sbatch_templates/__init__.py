"""The sbatch templates as a resources package: package data of the wheel, read by :mod:`hpc.render`.

The folder is top level (the project's layout names it) and a package of its own so that a wheel
install carries the templates and :func:`hpc.render.load_template` reads them through
:mod:`importlib.resources` the same way from a checkout and from an installed wheel.
"""
