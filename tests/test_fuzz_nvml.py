"""Fuzzing the NVML boundary (mocked pynvml): drivers that answer oddly, fail per call or lie about types;
discovery uses what it can, says what it could not, and never crashes."""
from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from fuzzing import outcome
from sp_plan.planner.cluster import Cluster
from sp_plan.planner.discover import build_cluster, describe_host
from sp_plan.planner.discover.nvml import read_nvml


class NVMLError(Exception):
    pass


ODD = st.sampled_from([None, -1, 0, 2**70, "x", b"\xff\xfe", 1.5, float("nan"), [], SimpleNamespace()])


class DrawnNvml:
    """pynvml whose every answer was drawn: a plausible value, an odd one, or an NVMLError."""

    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 6
    NVMLError = NVMLError

    def __init__(self, draw, n: int):
        self.draw, self.n = draw, n
        self.bus = [f"0000:{0x10 * (i + 1):02x}:00.0" for i in range(n)]

    def _answer(self, sane):
        how = self.draw(st.sampled_from(["sane"] * 6 + ["odd", "raise"]))
        if how == "raise":
            raise NVMLError("Not Supported")
        return self.draw(ODD) if how == "odd" else sane

    def nvmlInit(self):
        self._answer(None)

    def nvmlShutdown(self):
        self._answer(None)

    def nvmlDeviceGetCount(self):
        return self.n

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=self._answer(f"0000{self.bus[h].upper()}".encode()))

    def nvmlDeviceGetName(self, h):
        return self._answer(self.draw(st.sampled_from([b"NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "Tesla T4", ""])))

    def nvmlDeviceGetUUID(self, h):
        return self._answer(f"GPU-{h}")

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=self._answer(80 * 2**30))

    def nvmlDeviceGetNumaNodeId(self, h):
        return self._answer(h // 2)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._answer(5)

    def nvmlDeviceGetMigMode(self, h):
        return self._answer([self.draw(st.sampled_from([0, 1])), 0])

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._answer(16)

    def nvmlDeviceGetNvLinkState(self, h, link):
        return self._answer(1)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return SimpleNamespace(busId=self._answer(self.bus[(h + 1 + link) % self.n].encode()))

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        return self._answer(0)

    def nvmlDeviceGetFieldValues(self, h, ids):
        return [SimpleNamespace(nvmlReturn=self._answer(0), valueType=self._answer(1),
                                value=SimpleNamespace(uiVal=self._answer(25000)))]

    def nvmlDeviceGetP2PStatus(self, a, b, idx):
        return self._answer(0)

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return self._answer(self.draw(st.sampled_from([10, 20, 30, 40, 50])))


@given(st.data(), st.integers(1, 4))
def test_any_nvml_answers_give_a_host_or_a_clear_error(data, n):
    nvml = DrawnNvml(data.draw, n)
    host = outcome(lambda: describe_host("/nonexistent-sysfs", nvml=nvml, use_smi=False, hostname="fuzz"))
    if not hasattr(host, "gpus"):
        return  # a PlanError, checked by outcome()
    assert host.sources["nvml"].startswith(("ok", "unavailable", "failed"))
    for g in host.gpus:
        assert g.memory_bytes >= 0 and isinstance(g.name, str)
    got = outcome(lambda: build_cluster([host]))
    if isinstance(got, Cluster):
        assert got.world_size >= 1


@given(st.data(), st.integers(1, 4))
def test_read_nvml_raises_nothing_but_unavailable(data, n):
    nvml = DrawnNvml(data.draw, n)
    try:
        gpus = read_nvml(nvml)
    except Exception as e:  # noqa: BLE001 - what gather_sources turns into a note
        assert type(e).__name__ in ("NvmlUnavailable", "NVMLError"), repr(e)
        return
    assert len(gpus) == n
