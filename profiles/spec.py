"""The preset-style node description (profiles/clusters/*.yaml, or a user's file of that form), validated."""
from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sp_plan.planner.cluster import MAX_LATENCY_S, MIN_BYTES_PER_S, SCHEMA_VERSION
from sp_plan.planner.errors import PlanError
from sp_plan.planner.yamlio import check_schema_version, model_from_data

#: more devices in one node than any machine has: a typo, refused before building n^2 links
MAX_DEVICES_PER_NODE = 1024
_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


class IntraSpec(BaseModel):
    """The fabric among a node's devices; pcie means the PCIe tree (the ``pcie`` section) alone."""

    model_config = _STRICT
    kind: Literal["nvswitch", "nvlink", "hccs", "shm", "pcie"] = "pcie"
    capacity: float | None = Field(default=None, ge=MIN_BYTES_PER_S, description="bytes/s per direction")
    latency: float = Field(default=2e-6, ge=0, le=MAX_LATENCY_S)

    @model_validator(mode="after")
    def _check(self):
        if self.kind != "pcie" and self.capacity is None:
            raise PlanError("intra.capacity", f"intra kind {self.kind} needs a capacity", "give capacity in bytes/s")
        return self


class PcieSpec(BaseModel):
    """PCIe switches (device indices under each), sockets (switch indices under each), bridge capacities."""

    model_config = _STRICT
    capacity: float = Field(ge=MIN_BYTES_PER_S)
    latency: float = Field(default=3e-6, ge=0, le=MAX_LATENCY_S)
    switches: list[list[int]] = Field(min_length=1)
    sockets: list[list[int]] | None = Field(default=None, min_length=1)
    smp_capacity: float = Field(default=64e9, ge=MIN_BYTES_PER_S)
    tree: bool = False


class NicSpec(BaseModel):
    model_config = _STRICT
    attach: Literal["per_gpu", "per_switch", "host"]
    rate: float = Field(ge=MIN_BYTES_PER_S, description="bytes/s")
    network: Literal["ib", "roce", "ethernet"]
    latency: float = Field(default=5e-6, ge=0, le=MAX_LATENCY_S)
    count: int = Field(default=1, ge=1, le=64)


class NodeSpec(BaseModel):
    """One preset node: device (Device fields but its name), count, intra-node fabric, PCIe tree, NICs."""

    model_config = _STRICT
    schema_version: int = SCHEMA_VERSION  # the full cluster file's version: one rule for both forms
    name: str = "custom"
    source: str = ""
    devices_per_node: int = Field(gt=0, le=MAX_DEVICES_PER_NODE)
    device: dict[str, Any]
    fingerprint_memory_bytes: float | None = Field(
        default=None, gt=0, description="the device memory the node's fingerprints are computed with, where it "
        "differs from device.memory_bytes (a preset's decimal datasheet figure, which its plans and profiles are keyed by)")
    intra: IntraSpec = IntraSpec()
    pcie: PcieSpec | None = None
    nics: NicSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _version(cls, data):
        check_schema_version(data, SCHEMA_VERSION, "cluster")
        return data

    @model_validator(mode="after")
    def _check(self):
        if "name" in self.device:
            raise PlanError("device.name", "devices are named gpu0, gpu1, ... by position", "drop device.name")
        if self.intra.kind == "pcie" and self.pcie is None:
            raise self._no_fabric()
        if self.pcie:
            for g in self.pcie.switches:
                if not g or any(i < 0 for i in g):
                    raise PlanError("pcie.switches", f"group {g} is empty or has a negative index", "list device indices 0, 1, ...")
            k = len(self.pcie.switches)
            flat = [j for s in (self.pcie.sockets or [list(range(k))]) for j in s]
            if sorted(flat) != list(range(k)):
                raise PlanError("pcie.sockets", f"sockets {self.pcie.sockets} must list each switch index 0..{k - 1} once",
                                "put every PCIe switch under exactly one socket")
        if self.nics and self.nics.attach == "per_switch" and self.pcie is None:
            raise PlanError("nics.attach", "per_switch needs a pcie section", "use per_gpu or host, or add pcie")
        if self.nics and self.nics.attach == "host" and self.pcie is None and self.intra.kind != "shm":
            raise PlanError("nics.attach", "host needs a host bridge (a pcie section) or intra kind shm",
                            "add a pcie section or use attach per_gpu")
        return self

    def _no_fabric(self) -> PlanError:
        """The error for a node without a fabric: intra left out (pcie by default) or pcie named, and no pcie tree."""
        # name what the user wrote, or left out: a default kind they never typed is no field to fix
        fabrics = "|".join(k for k in get_args(IntraSpec.model_fields["kind"].annotation) if k != "pcie")
        tree = "a pcie section {capacity, switches} for a node joined by PCIe alone"
        if "intra" not in self.model_fields_set:
            return PlanError("intra", "no intra-node interconnect given",
                             f"add intra: {{kind: {fabrics}, capacity: BYTES_PER_S}}, or {tree}")
        if "kind" not in self.intra.model_fields_set:
            return PlanError("intra.kind", "no kind given, and pcie (the default) needs a pcie section",
                             f"give kind: {fabrics} with a capacity, or add {tree}")
        return PlanError("pcie", "intra kind pcie but no pcie section",
                         "add pcie: {capacity, switches} or another intra kind")


def node_spec(spec: Any, devices_per_node: int | None = None) -> dict:
    """``spec`` validated (PlanError naming the field otherwise), as a plain dict build_node_type reads."""
    if not isinstance(spec, dict):
        raise PlanError("cluster", "a preset node description must be a mapping", "write key: value pairs")
    if devices_per_node is not None:
        check_no_more_devices(spec, devices_per_node)
        spec = {**spec, "devices_per_node": devices_per_node}
    ns = model_from_data(NodeSpec, spec, "cluster")
    if devices_per_node is None and ns.pcie:  # as written (a smaller override keeps the groups of its devices)
        check_switch_groups(ns.pcie.switches, ns.devices_per_node)
    return ns.model_dump(exclude_none=True)


def check_no_more_devices(spec: dict, devices_per_node: int) -> None:
    """A node with fewer devices than its description keeps the PCIe groups of those it has; one with more would
    hang the others under no switch (no PCIe link, no NIC), so a count past a PCIe tree's devices is refused."""
    written = spec.get("devices_per_node")
    if spec.get("pcie") and isinstance(written, int) and devices_per_node > written:
        raise PlanError("devices_per_node", f"{devices_per_node} devices on a node that describes {written} under "
                        "its PCIe switches", f"use at most {written} devices per node, or more nodes of it")


def check_switch_groups(groups: list[list[int]], devices: int) -> None:
    """Every device index 0..devices-1 under exactly one PCIe switch: a device under none would get no PCIe link,
    one under two a second path, and an index past the devices would be dropped without a word."""
    flat = [i for g in groups for i in g]
    past = sorted({i for i in flat if i >= devices})
    twice = sorted({i for i in flat if flat.count(i) > 1})
    none = sorted(set(range(devices)) - set(flat))
    for what, ids in (("are past the node's devices", past), ("are in two groups", twice), ("are in no group", none)):
        if ids:
            raise PlanError("pcie.switches", f"device(s) {ids} {what} (devices_per_node {devices})",
                            f"list each device index 0..{devices - 1} in exactly one switch group")
