"""The tables' half of a lake move: a lake made by an older flywheel is read in today's schema,
one with columns this flywheel does not know is refused."""
from __future__ import annotations

import pyarrow as pa
import pytest

from storage.lake import LakeError, append_rows, open_lake, transaction
from storage.lake_move import check_move, source_rows
from storage.schemas import SCHEMAS
from storage.settings import LakeSettings


def _with_feedback(settings: LakeSettings) -> None:
    with open_lake(settings) as con, transaction(con):
        append_rows(con, "feedback", pa.Table.from_pylist(
            [{"completion_id": "x1", "label": "bad", "negative": True, "choice": 2, "cycle_id": "c"}],
            schema=SCHEMAS["feedback"]))


def test_a_column_an_older_lake_lacks_is_read_as_nulls(lake_settings):
    _with_feedback(lake_settings)
    with open_lake(lake_settings) as con:
        con.execute("ALTER TABLE lake.feedback DROP COLUMN choice")  # as a lake made before `choice` was
    with open_lake(lake_settings, read_only=True) as con:  # read-only: never brought up to date
        rows = pa.Table.from_batches(list(source_rows(con, "feedback")), schema=SCHEMAS["feedback"])
    assert rows.schema.equals(SCHEMAS["feedback"])
    assert rows.select(["completion_id", "label", "choice"]).to_pylist() == [
        {"completion_id": "x1", "label": "bad", "choice": None}]


def test_a_column_this_flywheel_does_not_know_stops_the_move(lake_settings, tmp_path):
    _with_feedback(lake_settings)
    with open_lake(lake_settings) as con:
        con.execute("ALTER TABLE lake.feedback ADD COLUMN mood VARCHAR")  # written by a newer flywheel
    with pytest.raises(LakeError, match=r"the source's feedback has columns this flywheel does not know \(mood\)"):
        check_move(lake_settings, LakeSettings(home=tmp_path / "new"))
    assert not (tmp_path / "new").exists()
