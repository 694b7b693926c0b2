"""Test-log parsers (pytest, unittest/Django) and diff path extraction, on real output shapes."""

from __future__ import annotations

from rollout_node.tasks.parsers import outcomes_for, parse_pytest, parse_unittest
from rollout_node.tasks.patches import patch_paths

# pytest -rA -v --continue-on-collection-errors; test_b.py fails to import; test_ok prints a fake
# result line, which lands in a captured-output section and must not count.
PYTEST_LOG = """\
============================= test session starts ==============================
collecting ... collected 7 items / 1 error
tests/test_a.py::test_ok PASSED                                          [ 14%]
tests/test_a.py::test_bad FAILED                                         [ 28%]
tests/test_a.py::test_p[a b] PASSED                                      [ 42%]
tests/test_a.py::test_p[c - d] FAILED                                    [ 57%]
tests/test_a.py::test_xf XFAIL                                           [ 71%]
tests/test_a.py::test_sk SKIPPED (no)                                    [ 85%]
tests/test_a.py::test_fx ERROR                                           [100%]
==================================== ERRORS ====================================
_______________________ ERROR collecting tests/test_b.py _______________________
E   ModuleNotFoundError: No module named 'nonexistent_module'
=================================== FAILURES ===================================
___________________________________ test_bad ___________________________________
E   assert 0
----------------------------- Captured stdout call -----------------------------
PASSED tests/test_a.py::test_bad
tests/test_a.py::test_bad PASSED
==================================== PASSES ====================================
=========================== short test summary info ============================
PASSED tests/test_a.py::test_ok
PASSED tests/test_a.py::test_p[a b]
SKIPPED [1] tests/test_a.py:8: no
XFAIL tests/test_a.py::test_xf
ERROR tests/test_b.py - ModuleNotFoundError: No module named 'nonexistent_module'
ERROR tests/test_a.py::test_fx - RuntimeError: fx
FAILED tests/test_a.py::test_bad - assert 0
FAILED tests/test_a.py::test_p[c - d] - AssertionError: assert 'c - d' != 'c ...
========= 2 failed, 2 passed, 1 skipped, 1 xfailed, 2 errors in 0.06s ==========
PASSED tests/test_a.py::test_bad
"""


def test_pytest_summary_is_authoritative() -> None:
    out = parse_pytest(PYTEST_LOG)
    assert out["tests/test_a.py::test_ok"] == "PASSED"
    assert out["tests/test_a.py::test_bad"] == "FAILED"  # fake PASSED lines in captured output / after the end
    assert out["tests/test_a.py::test_p[a b]"] == "PASSED"
    assert out["tests/test_a.py::test_p[c - d]"] == "FAILED"  # " - " inside a parametrised id
    assert out["tests/test_a.py::test_xf"] == "PASSED"
    assert out["tests/test_a.py::test_sk"] == "SKIPPED"
    assert out["tests/test_a.py::test_fx"] == "ERROR"


def test_pytest_collection_error_marks_that_files_tests_error_and_others_missing() -> None:
    tests = ("tests/test_b.py::test_never", "tests/test_a.py::test_ok", "tests/test_c.py::test_gone")
    assert outcomes_for(tests, PYTEST_LOG, "pytest") == {
        "tests/test_b.py::test_never": "ERROR", "tests/test_a.py::test_ok": "PASSED",
        "tests/test_c.py::test_gone": "MISSING"}


def test_pytest_crash_and_timeout_keep_partial_progress() -> None:
    crashed = ("collecting ... collected 3 items\n"
               "tests/test_a.py::test_one PASSED [ 33%]\n"
               "tests/test_a.py::test_two Fatal Python error: Segmentation fault\n\nCurrent thread 0x1:\n")
    tests = ("tests/test_a.py::test_one", "tests/test_a.py::test_two", "tests/test_a.py::test_three")
    assert outcomes_for(tests, crashed, "pytest") == {
        "tests/test_a.py::test_one": "PASSED", "tests/test_a.py::test_two": "MISSING",
        "tests/test_a.py::test_three": "MISSING"}
    assert outcomes_for(tests, "", "pytest") == dict.fromkeys(tests, "MISSING")
    # pytest 7 classic style (no percentages), XPASS counts as a failure
    assert parse_pytest("t.py::a PASSED\nt.py::b XPASS\n") == {"t.py::a": "PASSED", "t.py::b": "FAILED"}


def test_pytest_interrupted_collection_reports_the_file() -> None:
    log = ("=========================== short test summary info ============================\n"
           "ERROR tests/test_b.py\n"
           "!!!!!!!!!!!!!!!!!!!! Interrupted: 1 error during collection !!!!!!!!!!!!!!!!!!!!\n"
           "=============================== 1 error in 0.23s ===============================\n")
    assert outcomes_for(("tests/test_b.py::test_x", "tests/test_a.py::test_y"), log, "pytest") == {
        "tests/test_b.py::test_x": "ERROR", "tests/test_a.py::test_y": "MISSING"}


# python3.11 -m unittest -v (ids "name (mod.Class.name)"), one module failing to import
UNITTEST_LOG = """\
test_doc (test_m.T.test_doc)
Has a docstring. ... ok
test_err (test_m.T.test_err) ... ERROR
test_fail (test_m.T.test_fail) ... FAIL
test_ok (test_m.T.test_ok) ... ok
test_print (test_m.T.test_print) ... noiseok
test_skip (test_m.T.test_skip) ... skipped 'why'
test_xf (test_m.T.test_xf) ... expected failure
test_lie (test_m.T.test_lie) ... printed this
ok
broken_mod (unittest.loader._FailedTest.broken_mod) ... ERROR

======================================================================
ERROR: test_err (test_m.T.test_err)
----------------------------------------------------------------------
KeyError: 'x'

======================================================================
ERROR: broken_mod (unittest.loader._FailedTest.broken_mod)
----------------------------------------------------------------------
ImportError: Failed to import test module: broken_mod

======================================================================
FAIL: test_lie (test_m.T.test_lie)
----------------------------------------------------------------------
AssertionError: 1 != 2
----------------------------------------------------------------------
Ran 9 tests in 0.001s

FAILED (failures=1, errors=2, skipped=1, expected failures=1)
"""


def test_unittest_python311_format() -> None:
    out = parse_unittest(UNITTEST_LOG)
    assert out["test_doc (test_m.T)"] == "PASSED"
    assert out["test_err (test_m.T)"] == "ERROR"
    assert out["test_fail (test_m.T)"] == "FAILED"
    assert out["test_print (test_m.T)"] == "PASSED"
    assert out["test_skip (test_m.T)"] == "SKIPPED"
    assert out["test_xf (test_m.T)"] == "PASSED"
    assert out["test_lie (test_m.T)"] == "FAILED"  # the failure report overrides a printed "ok"


def test_unittest_django_format_and_import_errors() -> None:
    django = ("test_a (admin_views.tests.AdminTests) ... ok\n"
              "test_b (admin_views.tests.AdminTests)\nChecks b. ... FAIL\n"
              "test_c (admin_views.tests.AdminTests) ... unexpected success\n")
    tests = ("test_a (admin_views.tests.AdminTests)", "test_b (admin_views.tests.AdminTests.test_b)",
             "test_c (admin_views.tests.AdminTests)", "test_z (broken_mod.Z)", "test_q (other.Q)")
    assert outcomes_for(tests, django + UNITTEST_LOG, "unittest") == {
        "test_a (admin_views.tests.AdminTests)": "PASSED",
        "test_b (admin_views.tests.AdminTests.test_b)": "FAILED",
        "test_c (admin_views.tests.AdminTests)": "FAILED",
        "test_z (broken_mod.Z)": "ERROR",
        "test_q (other.Q)": "MISSING"}


def test_parsers_survive_garbage() -> None:
    garbage = "\x00\x1b[31m=== short test summary info ===\nPASSED\n::\n ... ok\nFAIL: \n" * 3
    assert isinstance(parse_pytest(garbage), dict)
    assert isinstance(parse_unittest(garbage), dict)


def test_patch_paths() -> None:
    diff = ('diff --git a/src/x.py b/src/x.py\n--- a/src/x.py\n+++ b/src/x.py\n@@ -1,2 +1,2 @@\n'
            '--- not a header\n+new\n'
            'diff --git a/old.py b/new.py\nsimilarity index 90%\nrename from old.py\nrename to new.py\n'
            'diff --git a/added.txt b/added.txt\nnew file mode 100644\n--- /dev/null\n+++ b/added.txt\n'
            'diff --git "a/sp ace\\303\\251.py" "b/sp ace\\303\\251.py"\ndeleted file mode 100644\n'
            '--- "a/sp ace\\303\\251.py"\n+++ /dev/null\n')
    assert patch_paths(diff) == ["src/x.py", "old.py", "new.py", "added.txt", "sp aceé.py"]
    assert patch_paths("--- x.py\n+++ x.py\n") == ["x.py"]
    assert patch_paths("") == []


def test_added_lines_and_test_paths() -> None:
    from rollout_node.tasks.harness import is_test_path
    from rollout_node.tasks.patches import added_lines
    diff = ("diff --git a/pkg/a.py b/pkg/a.py\n--- a/pkg/a.py\n+++ b/pkg/a.py\n@@ -1,2 +1,2 @@\n-old\n+new\n ctx\n"
            "diff --git a/b.py b/b.py\nnew file mode 100644\n--- /dev/null\n+++ b/b.py\n@@ -0,0 +1 @@\n++x\n")
    assert added_lines(diff) == {"pkg/a.py": ["new"], "b.py": ["+x"]}
    assert all(map(is_test_path, ["tests/helpers.py", "pkg/tests/data/x.json", "pkg/test_a.py", "a_test.py",
                                  "conftest.py", "tests/__init__.py"]))
    assert not any(map(is_test_path, ["django/test/utils.py", "pkg/testing.py", "tests", "attest.py"]))
