"""Side-by-side measurements of the platform, run as ``python -m benchmarks.<script>`` from the repo root.

A package (not loose scripts) so that the scripts, the tests and each other import one another by one
name, ``benchmarks.<module>``, without touching ``sys.path``; benchmarks/README.md maps each script to
the docs tables it writes and the committed records it reads them from.
"""
