"""The durable spool: cap, restart, crash safety."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from opsboard_agent.spool import Spool, SpoolLocked
from tests.agent.conftest import REPO


def body(batch_id: str, size: int = 100) -> bytes:
    return json.dumps({"batch_id": batch_id, "node": "n", "pad": "x" * size}).encode()


def test_it_hands_batches_out_oldest_first(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    for i in range(3):
        spool.put(f"b{i}", body(f"b{i}"))
    entry = spool.oldest()
    assert entry.batch_id == "b0" and json.loads(entry.body)["batch_id"] == "b0"
    spool.remove(entry.seq)
    spool.remove(entry.seq)  # twice is harmless
    assert spool.batch_ids() == ["b1", "b2"]


def test_at_the_cap_it_drops_the_oldest_and_counts(tmp_path):
    size = len(body("b00"))
    spool = Spool(tmp_path, max_bytes=size * 5)
    for i in range(12):
        spool.put(f"b{i:02d}", body(f"b{i:02d}"))
    assert spool.batch_ids() == [f"b{i:02d}" for i in range(7, 12)]
    assert spool.dropped == 7
    assert spool.size_bytes <= spool.max_bytes
    assert len(list(tmp_path.glob("*.batch"))) == 5


def test_at_the_cap_it_keeps_the_batch_being_sent_and_drops_the_next_oldest(tmp_path):
    # dropped while on the wire, a batch the server then stored was counted as lost too
    size = len(body("b00"))
    spool = Spool(tmp_path, max_bytes=size * 3)
    for i in range(3):
        spool.put(f"b{i:02d}", body(f"b{i:02d}"))
    entry = spool.oldest()
    with spool.sending(entry.seq):
        spool.put("b03", body("b03"))
    assert spool.batch_ids() == ["b00", "b02", "b03"]
    assert spool.dropped == 1
    spool.remove(entry.seq)  # delivered
    spool.put("b04", body("b04"))
    assert spool.batch_ids() == ["b02", "b03", "b04"]
    assert spool.dropped == 1


def test_it_survives_a_restart_with_the_same_batch_ids(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    for i in range(4):
        spool.put(f"b{i}", body(f"b{i}"))
    spool.remove(spool.oldest().seq)
    spool.close()
    reopened = Spool(tmp_path, max_bytes=1 << 20)
    assert reopened.batch_ids() == ["b1", "b2", "b3"]
    reopened.put("b4", body("b4"))  # sequence numbers continue after the old ones
    assert reopened.batch_ids() == ["b1", "b2", "b3", "b4"]


def test_a_second_process_cannot_share_a_spool(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    code = (
        "import sys; from opsboard_agent.spool import Spool, SpoolLocked\n"
        "try: Spool(sys.argv[1], max_bytes=1)\nexcept SpoolLocked: sys.exit(3)\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO)
    assert result.returncode == 3
    spool.close()
    with pytest.raises(SpoolLocked):
        a = Spool(tmp_path, max_bytes=1)
        try:
            Spool(tmp_path, max_bytes=1)  # same process, second open file: also refused
        finally:
            a.close()


def test_a_crash_between_write_and_rename_leaves_no_half_file(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.put("kept", body("kept"))
    spool.close()
    # A process that dies right after writing the temporary file (whole, or half of it).
    code = (
        "import os, sys, json\n"
        "from opsboard_agent.spool import Spool\n"
        "s = Spool(sys.argv[1], max_bytes=1 << 20)\n"
        "s._write_tmp(99, json.dumps({'batch_id': 'lost'}).encode())\n"
        "open(os.path.join(sys.argv[1], '.tmp-000000000100'), 'wb').write(b'{\"batch_i')\n"
        "os._exit(9)\n"
    )
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO)
    assert result.returncode == 9
    assert len(list(tmp_path.glob(".tmp-*"))) == 2
    reopened = Spool(tmp_path, max_bytes=1 << 20)
    assert reopened.batch_ids() == ["kept"]
    assert not list(tmp_path.glob(".tmp-*"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["000000000001.batch", "lock"]


def test_kill_9_while_writing_never_leaves_a_partial_batch(tmp_path):
    code = (
        "import sys, json\n"
        "from opsboard_agent.spool import Spool\n"
        "s = Spool(sys.argv[1], max_bytes=1 << 30, journal=True)\n"
        "i = 0\n"
        "while True:\n"
        "    i += 1\n"
        "    s.put(f'b{i}', json.dumps({'batch_id': f'b{i}', 'pad': 'x' * 50000}).encode())\n"
    )
    seen: list[str] = []
    for round_ in range(4):
        child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=REPO)
        time.sleep(0.6 + 0.1 * round_)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        spool = Spool(tmp_path, max_bytes=1 << 30, journal=True)
        for path in tmp_path.glob("*.batch"):
            json.loads(path.read_bytes())  # every visible batch is whole
        ids = spool.batch_ids()
        assert ids[: len(seen)] == seen  # nothing fsynced before was lost
        # The journal names exactly the batches that became durable.
        assert sorted(spool.journal_ids()) == sorted(ids)
        seen = ids
        spool.close()
    assert len(seen) > 4


def test_reopen_journals_a_repeated_batch_id_left_unjournaled_by_a_crash(tmp_path):
    # A crash between a batch's rename and its journal line, for a batch_id the journal
    # already names once (an earlier copy): reopening must add the second line.
    spool = Spool(tmp_path, max_bytes=1 << 20, journal=True)
    spool.put("again", json.dumps({"batch_id": "again"}).encode())
    spool.close()
    (tmp_path / "000000000002.batch").write_bytes(json.dumps({"batch_id": "again"}).encode())
    reopened = Spool(tmp_path, max_bytes=1 << 20, journal=True)
    assert reopened.batch_ids() == ["again", "again"]
    assert reopened.journal_ids() == ["again", "again"]
