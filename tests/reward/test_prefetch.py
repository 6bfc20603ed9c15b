"""`Evaluator.prefetch`: the golds of a batch (and the full ordered results behind LIMIT cuts) go into
the gold cache before scoring, so scoring then executes predictions only."""

from __future__ import annotations

import sqlite3

from sqlrl.reward.evaluator import Evaluator
from sqlrl.sql.sandbox import Sandbox
from sqlrl.tasks.data import PrivateTask, PublicTask
from sqlrl.tasks.goldcache import GoldCache


def test_prefetch_leaves_scoring_no_gold_to_fetch(tmp_path):
    path = tmp_path / "toy" / "toy.sqlite"
    path.parent.mkdir()
    con = sqlite3.connect(path)
    con.executescript(
        "CREATE TABLE t (x INTEGER, y TEXT); INSERT INTO t VALUES (1, 'a'), (2, 'b'), (2, 'c');"
    )
    con.commit()
    con.close()
    golds = ["SELECT y FROM t ORDER BY x DESC LIMIT 1", "SELECT count(*) FROM t", "SELECT nope FROM t"]
    tasks = [
        PrivateTask(PublicTask(f"t/{k}", "toy", "q?", "", "", str(path)), g) for k, g in enumerate(golds)
    ]
    preds = ["SELECT y FROM t WHERE y = 'c'", "SELECT 3", "SELECT 1"]
    with Sandbox(workers=1) as sb, GoldCache(tmp_path / "gc") as gc:
        ev = Evaluator(sb, gc)
        ev.prefetch(tasks + tasks[:1])  # a repeat is fetched once
        # 3 golds + the LIMIT gold's full ordered query (its DISTINCT-free variant is itself)
        assert (gc.misses, gc.executions) == (4, 4)
        got = ev.score_many(list(zip(preds, tasks)))
        assert gc.misses == 4  # nothing left to fetch
    # 'c' ties 'b' at the cut (x = 2): a legitimate tie; the broken gold is excluded, not scored 0
    assert [r.status for r in got] == ["match", "match", "gold_unscorable"]


def test_prefetch_warms_the_sandbox_connections_once_per_database(tmp_path):
    paths = []
    for name in ("a", "b"):
        path = tmp_path / name / f"{name}.sqlite"
        path.parent.mkdir()
        con = sqlite3.connect(path)
        con.executescript("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1), (2);")
        con.commit()
        con.close()
        paths.append(str(path))
    golds = ["SELECT x FROM t", "SELECT count(*) FROM t"]
    tasks = [
        PrivateTask(PublicTask(f"{p}/{k}", "db", "q?", "", "", p), g)
        for p in paths
        for k, g in enumerate(golds)
    ]

    class Recording(Sandbox):
        warmed: list

        def warm(self, db_paths):
            self.warmed.append(list(db_paths))
            return super().warm(db_paths)

    with Recording(workers=2) as sb, GoldCache(tmp_path / "gc") as gc:
        sb.warmed = []
        Evaluator(sb, gc).prefetch(tasks + tasks[:1])
        assert sb.warmed == [paths]  # one call, each database once, in first-seen order
        got = Evaluator(sb, gc).score_many([("SELECT x FROM t", tasks[0]), ("SELECT 2", tasks[3])])
    assert [r.status for r in got] == ["match", "match"]
