"""GPU telemetry straight from NVML (nvidia-ml-py), for nodes without dcgm-exporter.

Every reading is optional: a field the GPU or driver does not support is left out for that
GPU (and not asked again), never a reason to drop the others. XID errors come from an NVML
event set, polled without blocking at each collect, as `xid` events."""

from __future__ import annotations

import logging
from typing import Any

from opsboard_agent.collectors import Collector
from opsboard_agent.collectors.events import ErrorEvents, xid_event
from opsboard_agent.rates import RateTracker
from opsboard_agent.records import Event, Sample, sample

log = logging.getLogger(__name__)

ALL_LINKS = 0xFFFFFFFF  # scopeId asking NVML for the sum over all NVLink links


class GpuCollector(Collector):
    """`gpu.*` core metrics for every GPU NVML sees. Without a driver (or without the
    nvidia-ml-py package) `available` is False after one log line and collect returns []."""

    name = "gpu"

    def __init__(self) -> None:
        self.available = False
        self.gpu_count = 0
        self.gpu_model: str | None = None
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._unsupported: set[tuple[int, str]] = set()
        self._nvlink: list[RateTracker] = []
        self._errors = ErrorEvents()
        self._events: list[Event] = []
        self._event_set: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded...
            log.warning("GPU collector unavailable (no NVIDIA driver/NVML here): %s", exc)
            return
        self._nvml = pynvml
        self.available = True
        count = pynvml.nvmlDeviceGetCount()
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self.gpu_count = count
        self._nvlink = [RateTracker() for _ in range(count)]
        if count:
            name = pynvml.nvmlDeviceGetName(self._handles[0])
            self.gpu_model = name.decode() if isinstance(name, bytes) else str(name)
        self._register_xid_events()

    def _register_xid_events(self) -> None:
        nvml = self._nvml
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.info("NVML event sets unsupported, no XID events: %s", exc)
            return
        for index, handle in enumerate(self._handles):
            try:
                nvml.nvmlDeviceRegisterEvents(
                    handle, nvml.nvmlEventTypeXidCriticalError, self._event_set
                )
            except nvml.NVMLError as exc:
                log.info("GPU %d: XID events unsupported: %s", index, exc)

    def _read(self, index: int, what: str, fn, *args) -> Any:
        """fn(*args), or None (remembered) when this GPU does not support it."""
        if (index, what) in self._unsupported:
            return None
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            if isinstance(exc, self._nvml.NVMLError_NotSupported):
                self._unsupported.add((index, what))
            else:
                log.debug("GPU %d: %s failed: %s", index, what, exc)
            return None

    def collect(self, now: float) -> list[Sample]:
        if not self.available:
            return []
        samples: list[Sample] = []
        for index, handle in enumerate(self._handles):
            for metric, value in self._gpu_values(index, handle, now).items():
                if (record := sample(now, metric, value, gpu=index)) is not None:
                    samples.append(record)
        self._poll_xid(now)
        return samples

    def _gpu_values(self, index: int, handle: Any, now: float) -> dict[str, float]:
        nvml, read = self._nvml, self._read
        values: dict[str, float] = {}
        if (util := read(index, "util", nvml.nvmlDeviceGetUtilizationRates, handle)) is not None:
            values["gpu.util"] = util.gpu
        if (memory := read(index, "mem", nvml.nvmlDeviceGetMemoryInfo, handle)) is not None:
            values["gpu.mem_used_bytes"] = memory.used
            values["gpu.mem_total_bytes"] = memory.total
        temp = read(index, "temp", nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        if temp is not None:
            values["gpu.temp_c"] = temp
        if (power := read(index, "power", nvml.nvmlDeviceGetPowerUsage, handle)) is not None:
            values["gpu.power_w"] = power / 1000.0  # NVML reports milliwatts
        limit = read(index, "power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
        if limit is not None:
            values["gpu.power_limit_w"] = limit / 1000.0
        clock = read(index, "sm_clock", nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM)
        if clock is not None:
            values["gpu.sm_clock_mhz"] = clock
        # The "throttle" call was renamed "clocks event" in newer drivers; try the new first.
        reasons = read(index, "reasons", nvml.nvmlDeviceGetCurrentClocksEventReasons, handle)
        if reasons is None:
            reasons = read(
                index, "throttle", nvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle
            )
        if reasons is not None:
            values["gpu.throttle_reasons"] = reasons
        values.update(self._nvlink_rates(index, handle, now))
        for kind, error_type in (
            ("corrected", nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ("uncorrected", nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
        ):
            count = read(
                index,
                f"ecc_{kind}",
                nvml.nvmlDeviceGetTotalEccErrors,
                handle,
                error_type,
                nvml.NVML_VOLATILE_ECC,
            )
            if count is not None:
                values[f"gpu.ecc_{kind}"] = count
                if event := self._errors.ecc(("nvml", index, kind), now, index, count, kind):
                    self._events.append(event)
        return values

    def _nvlink_rates(self, index: int, handle: Any, now: float) -> dict[str, float]:
        nvml = self._nvml
        fields = [
            (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS),
            (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ALL_LINKS),
        ]
        result = self._read(index, "nvlink", nvml.nvmlDeviceGetFieldValues, handle, fields)
        if result is None or any(v.nvmlReturn != nvml.NVML_SUCCESS for v in result):
            return {}
        counters = {"tx": float(result[0].value.ullVal), "rx": float(result[1].value.ullVal)}
        rates = self._nvlink[index].update(counters, now)
        # The throughput counters are in KiB.
        return {f"gpu.nvlink_{key}_bytes_per_s": rate * 1024 for key, rate in rates.items()}

    def _poll_xid(self, now: float) -> None:
        nvml = self._nvml
        if self._event_set is None:
            return
        while True:
            try:
                data = nvml.nvmlEventSetWait_v2(self._event_set, 0)
            except nvml.NVMLError:  # NVML_ERROR_TIMEOUT: nothing pending (or the set broke)
                return
            if data.eventType & nvml.nvmlEventTypeXidCriticalError:
                try:
                    gpu = nvml.nvmlDeviceGetIndex(data.device)
                except nvml.NVMLError:
                    gpu = 0
                self._events.append(xid_event(now, gpu, int(data.eventData)))

    def take_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def close(self) -> None:
        if not self.available:
            return
        try:
            if self._event_set is not None:
                self._nvml.nvmlEventSetFree(self._event_set)
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass
        self.available = False
