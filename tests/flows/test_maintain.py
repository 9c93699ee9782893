"""The `lake-maintenance` flow: reads `[maintenance]` and the lake from flywheel.toml, runs the upkeep."""
from __future__ import annotations

from storage.lake import open_lake
from storage.settings import LakeSettings
from tests.storage.test_maintenance import COMMITS, _small_commits


def test_the_flow_merges_the_configured_lake(tmp_path, monkeypatch):
    settings = LakeSettings(home=tmp_path / "home")
    con, _ = _small_commits(settings)
    con.close()
    (tmp_path / "flywheel.toml").write_text(f'[lake]\nhome = "{settings.home}"\n[maintenance]\nfile_grace_hours = 0\n')
    monkeypatch.setenv("FLYWHEEL_CONFIG", str(tmp_path / "flywheel.toml"))
    monkeypatch.delenv("FLYWHEEL_HOME", raising=False)
    from flows.maintain import lake_maintenance_flow

    report = lake_maintenance_flow()
    assert (report["files_before"], report["files_after"], report["orphans_deleted"]) == (COMMITS, 1, 1)
    assert report["checkpoint_jobs_dropped"] == report["model_weights_dropped"] == 0  # no cycle trained here
    con = open_lake(settings, read_only=True)
    assert con.execute("SELECT count(*) FROM lake.quarantine").fetchone()[0] == COMMITS * 50 + 9
