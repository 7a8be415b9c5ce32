"""The Prometheus remote-write 1.0 wire format: a snappy-compressed (block format, not
framed) protobuf `prometheus.WriteRequest`, decoded with the protobuf runtime (upb).

The messages are declared here from prompb's `remote.proto` and `types.proto` (field numbers
as upstream; the parts Opsboard does not read -- exemplars, native histograms' buckets --
are left out, and protobuf skips them as unknown fields). No generated code and no protoc:
the descriptor is built once at import.
"""

from __future__ import annotations

from dataclasses import dataclass

import cramjam
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

# prompb MetricMetadata.MetricType
METADATA_TYPES = {
    0: "unknown",
    1: "counter",
    2: "gauge",
    3: "histogram",
    4: "gaugehistogram",
    5: "summary",
    6: "info",
    7: "stateset",
}


class WireError(ValueError):
    """A body that is not a remote-write request (said in the message)."""


@dataclass(frozen=True, slots=True)
class WriteRequest:
    """What Opsboard reads of one request: each series' labels and (ms, value) samples, how
    many series carried native histograms (not stored), and metadata: family → type."""

    series: list[tuple[dict[str, str], list[tuple[int, float]]]]
    histogram_series: list[dict[str, str]]
    metadata: dict[str, str]


def _message_class():
    F = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(
        name="opsboard/prompb.proto", package="prometheus", syntax="proto3"
    )

    def message(name: str, fields: list[tuple[str, int, int, int, str]]) -> None:
        proto = file.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            added = proto.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                added.type_name = type_name

    one, many = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    message("Label", [("name", 1, F.TYPE_STRING, one, ""), ("value", 2, F.TYPE_STRING, one, "")])
    message(
        "Sample", [("value", 1, F.TYPE_DOUBLE, one, ""), ("timestamp", 2, F.TYPE_INT64, one, "")]
    )
    # Only the presence of a native histogram is read (its timestamp, field 15).
    message("Histogram", [("timestamp", 15, F.TYPE_INT64, one, "")])
    message(
        "TimeSeries",
        [
            ("labels", 1, F.TYPE_MESSAGE, many, ".prometheus.Label"),
            ("samples", 2, F.TYPE_MESSAGE, many, ".prometheus.Sample"),
            ("histograms", 4, F.TYPE_MESSAGE, many, ".prometheus.Histogram"),
        ],
    )
    message(
        "MetricMetadata",
        [
            ("type", 1, F.TYPE_INT32, one, ""),  # an enum upstream; the same varint on the wire
            ("metric_family_name", 2, F.TYPE_STRING, one, ""),
        ],
    )
    message(
        "WriteRequest",
        [
            ("timeseries", 1, F.TYPE_MESSAGE, many, ".prometheus.TimeSeries"),
            ("metadata", 3, F.TYPE_MESSAGE, many, ".prometheus.MetricMetadata"),
        ],
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("prometheus.WriteRequest"))


_WriteRequest = _message_class()


def snappy_decode(body: bytes, limit: int) -> bytes:
    """The snappy block `body` decompressed; refused before decompressing when its declared
    length is over `limit` (a small body cannot inflate into a large allocation)."""
    try:
        declared = cramjam.snappy.decompress_raw_len(body)
    except Exception as exc:  # cramjam raises its own DecompressionError (and ValueError)
        raise WireError(f"not a snappy block: {exc}") from exc
    if declared > limit:
        raise WireError(f"decoded body of {declared} bytes, at most {limit}")
    try:
        return bytes(cramjam.snappy.decompress_raw(body))
    except Exception as exc:
        raise WireError(f"not a snappy block: {exc}") from exc


def write_request_decode(raw: bytes) -> WriteRequest:
    """The decompressed protobuf `raw` as a WriteRequest; WireError when it does not parse."""
    request = _WriteRequest()
    try:
        request.ParseFromString(raw)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise WireError(f"not a prometheus.WriteRequest: {exc}") from exc
    series = []
    histograms = []
    for ts in request.timeseries:
        labels = {label.name: label.value for label in ts.labels}
        if ts.histograms and not ts.samples:
            histograms.append(labels)
            continue
        series.append((labels, [(s.timestamp, s.value) for s in ts.samples]))
    metadata = {
        m.metric_family_name: METADATA_TYPES.get(m.type, "unknown") for m in request.metadata
    }
    return WriteRequest(series, histograms, metadata)


def write_request_encode(
    series: list[tuple[dict[str, str], list[tuple[int, float]]]],
    metadata: dict[str, int] | None = None,
) -> bytes:
    """A snappy-compressed WriteRequest (for tests and the benchmark: what Prometheus sends)."""
    request = _WriteRequest()
    for labels, samples in series:
        ts = request.timeseries.add()
        for name in sorted(labels):
            ts.labels.add(name=name, value=labels[name])
        for ms, value in samples:
            ts.samples.add(timestamp=ms, value=value)
    for family, kind in (metadata or {}).items():
        request.metadata.add(metric_family_name=family, type=kind)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))
