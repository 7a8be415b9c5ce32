"""Scrape target names: given (`NAME=URL`) or derived from the port, never shared."""

import pytest

from opsboard_agent.targets import TargetError, parse_targets


def names(*values, buckets=()):
    return [t.name for t in parse_targets(values, buckets)]


def test_it_names_targets_by_the_exporters_ports():
    assert names(
        "http://127.0.0.1:9100/metrics",
        "http://127.0.0.1:9400/metrics",
        "http://127.0.0.1:9256/metrics",
        "http://127.0.0.1:8080/metrics",
        "http://exporter/metrics",
    ) == ["node", "dcgm", "process", "scrape_8080", "scrape_80"]


def test_it_suffixes_unnamed_targets_that_would_share_a_name():
    assert names(
        "http://a:9100/metrics", "http://b:9100/metrics", "node=http://c:9100/", "http://d:9100/"
    ) == ["node_2", "node_3", "node", "node_4"]


def test_it_keeps_given_names_and_urls_with_query_strings():
    (target,) = parse_targets(["gpus=http://h:9400/metrics?collect[]=a=b"])
    assert (target.name, target.url) == ("gpus", "http://h:9400/metrics?collect[]=a=b")
    assert names("http://h:9400/metrics?x=1") == ["dcgm"]


def test_it_refuses_two_targets_of_one_name_and_unknown_bucket_targets():
    with pytest.raises(TargetError, match="two scrape targets"):
        names("a=http://h:1/", "a=http://h:2/")
    with pytest.raises(TargetError, match="no scrape target"):
        names("a=http://h:1/", buckets=["b=x"])
    with pytest.raises(TargetError, match="not an http"):
        names("node=ftp://h/metrics")


def test_it_keeps_buckets_only_of_allow_listed_families():
    node, dcgm = parse_targets(
        ["http://h:9100/", "http://h:9400/"], ["node=disk_seconds,net_seconds", "dcgm=*"]
    )
    assert node.keeps_buckets("disk_seconds") and not node.keeps_buckets("other")
    assert dcgm.keeps_buckets("anything")
