"""Collective communication costs (alpha-beta model) and the link each parallel group crosses.

Every cost is ``latency_s x hops + traffic_bytes / bandwidth_bytes_per_s``, where the traffic is
what one rank must send, from NCCL's performance notes (nccl-tests doc/PERFORMANCE.md): for a
buffer of S bytes over n ranks, the bus bandwidth is ``busbw = algbw x factor`` with
factor 2(n-1)/n for all-reduce and (n-1)/n for reduce-scatter, all-gather and all-to-all, so
``time = S x factor / busbw``. ``bandwidth_bytes_per_s`` below is that per-GPU, one-direction
bus bandwidth (already derated by the caller for what NCCL achieves on the link). The group-aware
collectives add NCCL's own latency model (src/graph/tuning.cc): a base latency per collective, and
a ring reduce-scatter or all-gather pays one step per rank, the steps inside a node and between nodes
at their own latency (``ring_latency_s``), which is what makes flat ZeRO-3 over thousands of ranks slow.

Rank order, innermost (fastest-varying) to outermost: ``tp, cp, dp, pp``; expert parallelism
splits the dp group from its innermost end (``ep`` ranks are consecutive dp ranks, stride
``tp x cp``). This is Megatron-Core's default ``tp-cp-ep-dp-pp``; Llama 3 (arXiv:2407.21783
§3.3.2) swaps dp and pp. Keeping dp inside pp lets a small dp group stay inside a node.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

from service.estimator.types import ClusterSpec, Layout

# The fastest network port a GPU has today: one 800 Gb/s ConnectX-8 SuperNIC per GPU (NVIDIA's
# ConnectX-8 datasheet), 100 GB/s one way. More per GPU across nodes is an NVLink domain spanning
# them (GB200 NVL72: 900 GB/s per GPU over 18 trays), or a NIC's Gb/s typed where GB/s is meant.
FASTEST_NIC_BYTES_PER_S = 100e9
# The most GPUs one NVLink domain joins today: a GB200 / GB300 NVL72 rack (NVIDIA's GB200 NVL72 page: 72
# Blackwell GPUs in one NVLink domain; MNNVL's multi-node tuning guide: InfiniBand between domains).
NVLINK_DOMAIN_GPUS = 72


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """Where one parallel group's traffic flows: ranks per node, nodes, and the two bandwidths."""

    group_size: int
    ranks_per_node: int  # members of the group that share one node
    nodes: int  # nodes the group spans
    intra_bandwidth_bytes_per_s: float
    inter_bandwidth_bytes_per_s: float
    intra_latency_s: float  # per ring step between GPUs of a node
    inter_latency_s: float  # per ring step between nodes
    base_latency_s: float = 0.0  # once per collective (NCCL's launch and protocol set-up)
    # one send between two GPUs of a node where that is less than the group's collectives get: a
    # mesh's single link (``mesh_fraction``); None: the intra-node bandwidth
    send_intra_bandwidth_bytes_per_s: float | None = None

    @property
    def spans_nodes(self) -> bool:
        return self.nodes > 1

    @property
    def send_intra_bytes_per_s(self) -> float:
        """A point-to-point send's bandwidth between two GPUs of one node."""
        send = self.send_intra_bandwidth_bytes_per_s
        return self.intra_bandwidth_bytes_per_s if send is None else send

    @property
    def send_bandwidth_bytes_per_s(self) -> float:
        """A point-to-point send's bottleneck: the network where the group spans nodes, else one send
        inside a node (a pipeline's or a ring's: one link of a mesh, whatever the group's size)."""
        return self.inter_bandwidth_bytes_per_s if self.spans_nodes else self.send_intra_bytes_per_s

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """The bottleneck link of a flat (single-level) collective over the whole group."""
        return self.inter_bandwidth_bytes_per_s if self.spans_nodes else self.intra_bandwidth_bytes_per_s

    @property
    def latency_s(self) -> float:
        return self.inter_latency_s if self.spans_nodes else self.intra_latency_s


# A collective over a group: (bytes, link) -> seconds.
Collective = Callable[[float, "Link"], float]

# ---------------------------------------------------------------- flat collectives


def ring_all_reduce_s(size_bytes: float, n: int, bandwidth_bytes_per_s: float, latency_s: float) -> float:
    # ring: reduce-scatter then all-gather, 2(n-1) steps of S/n each (NCCL busbw factor 2(n-1)/n)
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * latency_s + 2 * (n - 1) / n * size_bytes / bandwidth_bytes_per_s


def tree_all_reduce_s(size_bytes: float, n: int, bandwidth_bytes_per_s: float, latency_s: float) -> float:
    # NCCL double binary tree: reduce up + broadcast down, 2 log2(n) hops of latency; pipelined,
    # each rank moves about 2S (no (n-1)/n saving), so it wins only for small messages
    if n <= 1:
        return 0.0
    return 2 * math.ceil(math.log2(n)) * latency_s + 2 * size_bytes / bandwidth_bytes_per_s


def all_reduce_s(size_bytes: float, n: int, bandwidth_bytes_per_s: float, latency_s: float) -> float:
    """NCCL picks the faster of ring and tree; so do we."""
    return min(
        ring_all_reduce_s(size_bytes, n, bandwidth_bytes_per_s, latency_s),
        tree_all_reduce_s(size_bytes, n, bandwidth_bytes_per_s, latency_s),
    )


def reduce_scatter_s(size_bytes: float, n: int, bandwidth_bytes_per_s: float, latency_s: float) -> float:
    # size_bytes is the full (unsharded) buffer; each rank sends (n-1)/n of it in n-1 steps
    if n <= 1:
        return 0.0
    return (n - 1) * latency_s + (n - 1) / n * size_bytes / bandwidth_bytes_per_s


def all_to_all_s(size_bytes: float, n: int, bandwidth_bytes_per_s: float, latency_s: float) -> float:
    # size_bytes is what one rank holds before the exchange; it keeps 1/n and sends (n-1)/n
    if n <= 1:
        return 0.0
    return (n - 1) * latency_s + (n - 1) / n * size_bytes / bandwidth_bytes_per_s


def p2p_s(size_bytes: float, bandwidth_bytes_per_s: float, latency_s: float) -> float:
    # one send/recv between neighbouring pipeline stages
    return latency_s + size_bytes / bandwidth_bytes_per_s


# ---------------------------------------------------------------- group-aware collectives


def hierarchical_all_reduce_s(size_bytes: float, link: Link) -> float:
    """Reduce-scatter inside each node, all-reduce 1/g of the data across nodes, all-gather inside.

    Each of the g local ranks runs its own inter-node all-reduce on its S/g shard over its own
    NIC share, in parallel (NCCL's tree/ring over NVLink+IB behaves the same to first order).
    """
    g = link.ranks_per_node
    intra = 2 * reduce_scatter_s(size_bytes, g, link.intra_bandwidth_bytes_per_s, link.intra_latency_s)
    inter = all_reduce_s(size_bytes / g, link.nodes, link.inter_bandwidth_bytes_per_s, link.inter_latency_s)
    return intra + inter


def group_all_reduce_s(size_bytes: float, link: Link) -> float:
    """All-reduce over a group: flat inside a node, hierarchical when it spans nodes."""
    if link.group_size <= 1:
        return 0.0
    if link.spans_nodes and link.ranks_per_node > 1:
        return link.base_latency_s + hierarchical_all_reduce_s(size_bytes, link)
    if not link.spans_nodes:
        # inside a node NCCL's tree is a chain (src/graph/tuning.cc: its intra-node steps are the
        # ring's), never faster than the ring: the double binary tree's log2 steps are between nodes
        return link.base_latency_s + ring_all_reduce_s(
            size_bytes, link.group_size, link.bandwidth_bytes_per_s, link.latency_s
        )
    return link.base_latency_s + all_reduce_s(
        size_bytes, link.group_size, link.bandwidth_bytes_per_s, link.latency_s
    )


def ring_latency_s(link: Link) -> float:
    """Latency of one ring reduce-scatter or all-gather over the group (NCCL src/graph/tuning.cc):
    base + (n - N) steps between GPUs of a node + (N - 1) steps between nodes, for n ranks on N
    nodes. NCCL runs these two collectives as a flat ring (not a tree), so at thousands of ranks the
    steps add up to milliseconds."""
    steps_in_nodes = link.group_size - link.nodes
    return (
        link.base_latency_s + steps_in_nodes * link.intra_latency_s + (link.nodes - 1) * link.inter_latency_s
    )


def group_reduce_scatter_s(size_bytes: float, link: Link) -> float:
    """Reduce-scatter over a group: the ring's latency plus its traffic. Across nodes NCCL's rings
    use every GPU's NIC, so the inter-node traffic is S/g per GPU (g of the group per node) after
    the intra-node share, (g-1)/g S, over NVLink."""
    if link.group_size <= 1:
        return 0.0
    if not link.spans_nodes:
        n = link.group_size
        return ring_latency_s(link) + (n - 1) / n * size_bytes / link.intra_bandwidth_bytes_per_s
    g, nodes = link.ranks_per_node, link.nodes
    intra = (g - 1) / g * size_bytes / link.intra_bandwidth_bytes_per_s
    inter = (nodes - 1) / nodes * (size_bytes / g) / link.inter_bandwidth_bytes_per_s
    return ring_latency_s(link) + intra + inter


def group_all_gather_s(size_bytes: float, link: Link) -> float:
    """All-gather over a group: the mirror image of ``group_reduce_scatter_s``."""
    return group_reduce_scatter_s(size_bytes, link)


def group_all_to_all_s(size_bytes: float, link: Link) -> float:
    """All-to-all over a group: each rank keeps 1/n of the ``size_bytes`` it holds and sends 1/n to
    every other member at once. Inside a node that is (n-1)/n over NVLink. Across nodes the 1/n for
    each of the g-1 members on its node stays on NVLink and the (n-g)/n for the others leaves by its
    NIC, concurrently (NCCL posts every peer's send together): the slower of the two bounds it, with a
    step of the inter-node latency per peer (all of it crossed the NIC before: 2x too long at ep 16 on
    two nodes of 8, network review, stop 41)."""
    n = link.group_size
    if n <= 1:
        return 0.0
    if not link.spans_nodes:
        return link.base_latency_s + all_to_all_s(
            size_bytes, n, link.intra_bandwidth_bytes_per_s, link.intra_latency_s
        )
    g = link.ranks_per_node
    inter = (n - g) / n * size_bytes / link.inter_bandwidth_bytes_per_s
    intra = (g - 1) / n * size_bytes / link.intra_bandwidth_bytes_per_s
    return link.base_latency_s + (n - 1) * link.inter_latency_s + max(inter, intra)


# ---------------------------------------------------------------- placement


def link_for_group(
    cluster: ClusterSpec,
    group_size: int,
    stride: int,
    *,
    intra_latency_s: float = 0.0,
    inter_latency_s: float = 0.0,
    base_latency_s: float = 0.0,
    intra_efficiency: float = 1.0,
    inter_efficiency: float = 1.0,
) -> Link:
    """The link of a group of ``group_size`` ranks ``stride`` apart in the global rank order.

    Ranks fill nodes in order, so consecutive members share a node while ``stride`` < GPUs per
    node; the group stays inside one node when ``group_size x stride`` <= GPUs per node. A stride
    that does not divide the node (DeepSpeed's tied-embedding pair, (pp - 1) x tp x cp x dp apart)
    puts some groups across a node boundary, the slowest of which the step waits for; but no group
    spans more nodes than the cluster has (on one node, none crosses a network, whatever the
    cluster's inter-node figure). Efficiencies derate the nominal bandwidths to what NCCL achieves
    (busbw / nominal), for the links whose busbw the cluster does not state as measured.
    """
    gpn = cluster.gpus_per_node
    if cluster.num_nodes > 1 and not _tiles_nodes(gpn, group_size, stride):
        ranks_per_node, nodes = uneven_placement(gpn, cluster.world_size, group_size, stride)
    else:
        ranks_per_node = max(1, min(group_size, gpn // stride)) if stride < gpn else 1
        nodes = math.ceil(group_size / ranks_per_node)
        if nodes > cluster.num_nodes:  # the stride's count overshoots the cluster: its nodes hold it
            nodes = cluster.num_nodes
            ranks_per_node = math.ceil(group_size / nodes)
    one_link = mesh_fraction(cluster, 2)  # a send between two GPUs: one link of a mesh
    send = _intra_bytes_per_s(cluster, one_link, intra_efficiency) if one_link < 1.0 else None
    return Link(
        group_size=group_size,
        ranks_per_node=ranks_per_node,
        nodes=nodes,
        intra_bandwidth_bytes_per_s=_intra_bytes_per_s(
            cluster, mesh_fraction(cluster, ranks_per_node), intra_efficiency
        ),
        inter_bandwidth_bytes_per_s=achieved_bandwidth_bytes_per_s(
            cluster.inter_node_bandwidth_bytes_per_s,
            cluster.measured_inter_node_bus_bandwidth_bytes_per_s,
            inter_efficiency,
        ),
        intra_latency_s=intra_latency_s,
        inter_latency_s=inter_latency_s,
        base_latency_s=base_latency_s,
        send_intra_bandwidth_bytes_per_s=send,
    )


def _intra_bytes_per_s(cluster: ClusterSpec, share: float, efficiency: float) -> float:
    """What NCCL achieves on ``share`` of a node's GPU-to-GPU links (``mesh_fraction``), nominal or as
    the cluster measured all of them."""
    measured = cluster.measured_intra_node_bus_bandwidth_bytes_per_s
    return achieved_bandwidth_bytes_per_s(
        cluster.intra_node_bandwidth_bytes_per_s * share,
        measured * share if measured is not None else None,
        efficiency,
    )


def mesh_fraction(cluster: ClusterSpec, ranks_per_node: int) -> float:
    """The share of a node's GPU-to-GPU bandwidth a group with ``ranks_per_node`` members in it uses:
    on a fully connected mesh (``GPUSpec.mesh_links``: MI300X's 7 xGMI links), each member reaches
    its ranks_per_node - 1 peers over one link each, so the group moves at most that many links'
    worth (AMD's RCCL/xGMI note: each peer pair shares one 64 GB/s link; the 448 GB/s aggregate needs
    collectives over all 7 peers); through a switch, every group gets the whole bandwidth (1). A tp 2
    group on an MI300X was timed at all 7 links, 6.7x fast (AMD review)."""
    links = cluster.gpu.mesh_links
    if links is None or ranks_per_node < 2:
        return 1.0
    return min(1.0, (ranks_per_node - 1) / links)


def _tiles_nodes(gpn: int, group_size: int, stride: int) -> bool:
    """Every group of ``group_size`` ranks ``stride`` apart has the same members on each node it
    spans: each member on a node of its own (stride a node or more), or the stride divides the node
    and the groups' span (size x stride) is a divisor or a multiple of it."""
    span = group_size * stride
    return group_size <= 1 or stride >= gpn or (gpn % stride == 0 and (gpn % span == 0 or span % gpn == 0))


@functools.lru_cache(maxsize=4096)
def uneven_placement(gpn: int, world_size: int, group_size: int, stride: int) -> tuple[int, int]:
    """(ranks_per_node, nodes) of the slowest group where groups do not tile the nodes (3 or 6 GPUs
    per node, tp 2 or 4; dp 3 on nodes of 2): some group has r members on one node and the rest
    elsewhere. Its n = group_size ranks' reduce-scatter leaves node-by-node (NCCL's rings run over
    every GPU's NIC): the node of r members sends its peers' (n - r) shards of S / n over its r NICs,
    (n - r) / (r n) S per GPU, the most for the least r. As a ``Link`` of r ranks per node that is
    (N - 1) / N x S / r with N = n / r "nodes" (rounded up): the aligned formula when r = n / N.

    Groups start at j + b x size x stride (j < stride) in Megatron's rank order (tp, cp, dp, pp
    innermost first); only each start's offset within its node matters, at most ``gpn`` of them."""
    span = group_size * stride
    starts = min(max(1, world_size // span), gpn)
    offsets = {(b * span) % gpn for b in range(starts)}
    phases = {(j + o) % gpn for j in range(min(stride, gpn)) for o in offsets}
    least = group_size
    for phase in phases:
        last = (phase + (group_size - 1) * stride) // gpn
        if last == 0:
            continue  # the group stays on its first node
        first_count = (gpn - 1 - phase) // stride + 1
        before_last = (last * gpn - phase + stride - 1) // stride  # members on nodes before the last
        counts = [first_count, group_size - before_last]
        if last > 1:
            counts.append(gpn // stride)  # an interior node holds gpn // stride or one more
        least = min(least, *counts)
    if least >= group_size:
        return group_size, 1
    return least, math.ceil(group_size / least)


def achieved_bandwidth_bytes_per_s(
    nominal_bytes_per_s: float, measured_bytes_per_s: float | None, efficiency: float
) -> float:
    """The bus bandwidth NCCL's collectives get on a link: the cluster's measured all-reduce busbw
    where it states one (nothing assumed), else the nominal link x the tuning's bus efficiency.

    A measurement above the link (in-network reduction: NVLS, SHARP) is used at the link: the
    collectives here are rings, trees, all-to-alls and sends, none of which reduces in the switch."""
    if measured_bytes_per_s is None:
        return nominal_bytes_per_s * efficiency
    return min(measured_bytes_per_s, nominal_bytes_per_s)


def bus_bandwidth_notes(
    cluster: ClusterSpec, intra_efficiency: float, inter_efficiency: float
) -> tuple[str, ...]:
    """The bus bandwidth the collectives were timed at, and where it came from: measured, or nominal x
    the tuning's efficiency; inside a node where a node has more than one GPU, between nodes where
    the cluster has more than one node."""
    notes = []
    if cluster.gpus_per_node > 1:
        intra = cluster.intra_node_bandwidth_bytes_per_s
        notes.append(
            _bus_bandwidth_note(
                "intra-node", intra, cluster.measured_intra_node_bus_bandwidth_bytes_per_s, intra_efficiency
            )
        )
        if not cluster.gpu.peer_to_peer and cluster.measured_intra_node_bus_bandwidth_bytes_per_s is None:
            # NCCL's SHM transport: every byte is written to and read from host memory, whose bandwidth
            # bounds it below the PCIe figure (8 RTX 5090s: 28 GB/s bus bandwidth on PCIe 5; NCCL's
            # maintainers, NVIDIA/nccl#1639); not modelled: a measured figure replaces the nominal one
            notes.append(
                f"{cluster.gpu.name} has no peer-to-peer between GPUs: NCCL stages their traffic through "
                "host memory, whose bandwidth bounds it below the figure above (not modelled); state "
                "measured_intra_node_bus_bandwidth_bytes_per_s (nccl-tests all_reduce_perf's busbw) to "
                "time it at what the node measures"
            )
        links = cluster.gpu.mesh_links
        if links is not None:
            notes.append(
                f"{cluster.gpu.name}'s GPUs are a mesh of {links} links each: a group of k of a node's GPUs "
                f"moves over k - 1 of them, (k - 1)/{links} of that bandwidth (a tp 2 pair: 1/{links})"
            )
    if cluster.num_nodes > 1:
        inter = cluster.inter_node_bandwidth_bytes_per_s
        notes.append(
            _bus_bandwidth_note(
                "inter-node", inter, cluster.measured_inter_node_bus_bandwidth_bytes_per_s, inter_efficiency
            )
        )
    return tuple(notes)


def used_link_defaults(cluster: ClusterSpec) -> tuple[tuple[str, str], ...]:
    """The link figures the GPU's source left out (``GPUSpec.defaulted``) that this cluster uses:
    the host link always (offload crosses it); the link between GPUs where a node has more than one
    and the cluster took the GPU's figure rather than stating its own."""
    gpu = cluster.gpu
    return tuple(
        (name, why)
        for name, why in gpu.defaulted
        if name != "intra_node_bandwidth_bytes_per_s"
        or (
            cluster.gpus_per_node > 1
            and cluster.intra_node_bandwidth_bytes_per_s == gpu.intra_node_bandwidth_bytes_per_s
        )
    )


def link_default_notes(cluster: ClusterSpec) -> tuple[str, ...]:
    """``used_link_defaults`` in words, with the figure assumed."""
    gpu = cluster.gpu
    return tuple(
        f"{name} not stated for {gpu.name}: {getattr(gpu, name) / 1e9:g} GB/s assumed, {why}"
        for name, why in used_link_defaults(cluster)
    )


def _bus_bandwidth_note(where: str, nominal: float, measured: float | None, efficiency: float) -> str:
    gbps = achieved_bandwidth_bytes_per_s(nominal, measured, efficiency) / 1e9
    if measured is None:
        return (
            f"{where} bus bandwidth: nominal {nominal / 1e9:.4g} GB/s x {efficiency:g} bus efficiency "
            f"(tuning, not measured) = {gbps:.4g} GB/s per GPU"
        )
    text = f"{where} bus bandwidth measured: {measured / 1e9:.4g} GB/s per GPU"
    if measured > nominal:
        return (
            f"{text}, above the {nominal / 1e9:.4g} GB/s link (in-network reduction): used at the link's "
            f"{gbps:.4g} GB/s, since the rings, all-to-alls and sends timed here do not reduce in the switch"
        )
    return f"{text} (nominal link {nominal / 1e9:.4g} GB/s)"


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupStrides:
    """Distance in global ranks between neighbours of each parallel group (order tp, cp, dp, pp)."""

    tp: int
    cp: int
    dp: int
    pp: int


def group_strides(layout: Layout) -> GroupStrides:
    inner = layout.tp * layout.cp
    return GroupStrides(tp=1, cp=layout.tp, dp=inner, pp=inner * layout.dp)


def expert_stride(layout: Layout) -> int:
    """Distance between expert-parallel neighbours. The experts have their own grid, etp x ep x
    expert-dp over a stage's ranks, so ep neighbours are etp apart: Megatron folds context
    parallelism into expert-dp (parallel_state's expert RankGenerator), torchtitan's ep borrows the
    cp and dp-shard ranks, DeepSpeed's expert groups are data-parallel ranks tp apart."""
    return layout.expert_tp
