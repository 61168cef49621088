"""pytest plugin for running NIXL's own suite against te's nixl package
(`python -m pytest -p te_nixl_harness ...`): a test may skip only for lack
of a GPU or by NIXL's own unconditional skip marks; any other skip (a
backend that failed to come up, say) fails the run, so a broken package
cannot pass by skipping."""

ALLOWED = ("unconditional skip", "GPU", "gpu", "CUDA", "cuda")

_bad = []


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if not any(a in reason for a in ALLOWED):
            _bad.append(f"{report.nodeid}: {reason}")


def pytest_sessionfinish(session, exitstatus):
    if _bad:
        print("\nte_nixl_harness: tests skipped for a reason other than a missing GPU:\n  " + "\n  ".join(_bad))
        session.exitstatus = 1
