"""XID and ECC: the catalog, and findings from events and counters."""

from __future__ import annotations

import pytest

from detectors import xid
from detectors.types import EventRow
from tests.detectors.builders import T0, cluster, series


def test_the_catalog_explains_79_as_fallen_off_the_bus():
    info = xid.xid_info(79)
    assert info.meaning == "GPU has fallen off the bus" and info.fatal
    assert info.action_code == "RESTART_BM" and "reboot" in info.action


def test_the_catalog_explains_48_as_a_fatal_dbe_ecc_error():
    info = xid.xid_info(48)
    assert "DBE" in info.meaning and "ECC" in info.meaning and info.fatal
    assert "reset the GPU" in info.action


def test_the_catalog_loads_every_code_and_tolerates_its_quirks():
    catalog = xid.xid_catalog()
    assert len(catalog) >= 160 and set(range(1, 163)) <= set(catalog)
    assert catalog[154].mnemonic == "GPU_RECOVERY_ACTION_CHANGED"  # trailing space trimmed
    assert catalog[162].meaning and catalog[162].fatal  # no name upstream
    assert not catalog[13].fatal and catalog[13].action == "restart the application"
    assert xid.xid_info(9999).meaning == "XID 9999 (not in the catalog)"


def event(code, gpu=3, ts=100.0):
    return EventRow(T0 + ts, "xid", "n2", gpu=gpu, data={"code": code, "message": "NVRM: Xid"})


@pytest.mark.parametrize(("code", "severity"), [(79, "critical"), (13, "warning")])
def test_each_xid_is_a_finding_with_its_meaning_and_action(code, severity):
    (f,) = xid.detect(cluster(events=[event(code)]), T0 + 200)
    assert f.kind == "xid" and f.subject == f"node:n2/gpu:3/xid:{code}" and f.severity == severity
    assert f.node == "n2" and f.gpu == 3 and f.evidence["code"] == code
    assert xid.xid_info(code).meaning in f.summary and xid.xid_info(code).action in f.summary


def test_repeats_of_one_code_on_one_gpu_are_one_finding():
    (f,) = xid.detect(cluster(events=[event(79, ts=100), event(79, ts=150)]), T0 + 200)
    assert f.evidence["count"] == 2 and f.since == T0 + 100


def test_an_ecc_event_is_critical():
    ecc = EventRow(T0 + 5, "ecc", "n2", gpu=6, data={"count": 2})
    (f,) = xid.detect(cluster(events=[ecc]), T0 + 10)
    assert f.kind == "ecc" and f.subject == "node:n2/gpu:6" and f.severity == "critical"
    assert f.evidence["uncorrectable"] == 2


@pytest.mark.parametrize(("values", "expected"), [([0, 0, 0], 0), ([1, 1, 2], 1)])
def test_a_rising_uncorrectable_counter_is_critical(values, expected):
    telemetry = [series("n2", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", values, gpu=0)]
    found = xid.detect(cluster(telemetry=telemetry), T0 + 30)
    assert [f.kind for f in found] == ["ecc"] * expected
