"""The parts of ``scripts/soak.py``: the roles it runs (:mod:`.procs`, :mod:`.harness`), what it
watches while they run (:mod:`.observe`), the ``/process`` client beside them (:mod:`.client`), the
kills (:mod:`.scheduler`) and the end-of-run checks (:mod:`.audit`)."""
