"""``bench.common.profile_summary``: the share of a profiled beat's working samples."""

from pathlib import Path

import pytest

from bench import common


@pytest.mark.parametrize("work", ["_work", "LeaseScheduler._work"])
def test_the_beats_working_samples_are_found_whatever_py_spy_names_the_method(
    tmp_path: Path, work: str
) -> None:
    # py-spy 0.4 names a method with its class ("LeaseScheduler._work"); before, without.
    # Before, the summary of a 0.4 profile had no sample (samples: 0).
    beat = "schedapp/beat.py"
    (tmp_path / "p.txt").write_text(
        f"main (x.py:1);{work} ({beat}:10);claim (schedapp/lease/claim.py:5) 3\n"
        f"main (x.py:1);{work} ({beat}:10);publish (schedapp/dispatch.py:7) 1\n"
        "main (x.py:1);sleep (time.py:2) 6\n"
    )
    summary = common.profile_summary(tmp_path / "p.txt")
    shares = {f["frame"]: f["share"] for f in summary["functions"]}
    assert summary["samples"] == 4
    assert shares["claim (schedapp/lease/claim.py)"] == 0.75
