#!/usr/bin/env python3
"""Writes the machine descriptions in this folder as hwloc XML v2.

Each machine is described from published facts (vendor system guides and
`nvidia-smi topo -m` listings published for these systems): sockets, NUMA
nodes per socket, cores, SMT, last-level caches, memory, and which PCIe root
each GPU hangs off. The XML is what `lstopo --of xml` would write for such a
machine, reduced to what numapin reads. Run `python3 topology/gen_fixtures.py`
after changing a description; tests/fixtures.rs asserts each GPU's node.
"""

import os

GIB = 1 << 30
HERE = os.path.dirname(os.path.abspath(__file__))


def mask(ids):
    """hwloc bitmap text: comma-separated 32-bit words, most significant first."""
    ids = list(ids)
    if not ids:
        return "0x0"
    words = [0] * (max(ids) // 32 + 1)
    for i in ids:
        words[i // 32] |= 1 << (i % 32)
    return "0x" + ",0x".join("%08x" % w for w in reversed(words))


class Gen:
    def __init__(self):
        self.gp = 0
        self.lines = []

    def gpi(self):
        self.gp += 1
        return self.gp

    def out(self, depth, text):
        self.lines.append("  " * depth + text)


def sets(cpus, nodes):
    c, n = mask(cpus), mask(nodes)
    return (f'cpuset="{c}" complete_cpuset="{c}" nodeset="{n}" complete_nodeset="{n}"')


def write_machine(name, m):
    """m: dict with packages: [ {nodes: [node...]} ], machine_nodes, gpus_machine, allowed."""
    g = Gen()
    all_cpus = sorted(c for p in m["packages"] for n in p["nodes"] for core in n["cores"] for c in core)
    all_nodes = sorted([n["os"] for p in m["packages"] for n in p["nodes"] + p.get("gpu_memory_nodes", [])]
                       + [n["os"] for n in m.get("extra_nodes", [])])
    allowed = m.get("allowed_cpus", all_cpus)
    g.out(0, '<?xml version="1.0" encoding="UTF-8"?>')
    g.out(0, '<!DOCTYPE topology SYSTEM "hwloc2.dtd">')
    g.out(0, '<topology version="2.0">')
    g.out(1, f'<object type="Machine" os_index="0" {sets(all_cpus, all_nodes)} '
             f'allowed_cpuset="{mask(allowed)}" allowed_nodeset="{mask(all_nodes)}" gp_index="{g.gpi()}">')
    g.out(2, f'<info name="DMIProductName" value="{m["product"]}"/>')
    g.out(2, '<info name="Backend" value="Linux"/>')
    for n in m.get("extra_nodes", []):
        write_node(g, 2, n, all_cpus)
    for pi, p in enumerate(m["packages"]):
        pcpus = sorted(c for n in p["nodes"] for core in n["cores"] for c in core)
        pnodes = [n["os"] for n in p["nodes"]] + [n["os"] for n in p.get("gpu_memory_nodes", [])]
        g.out(2, f'<object type="Package" os_index="{pi}" {sets(pcpus, pnodes)} gp_index="{g.gpi()}">')
        g.out(3, f'<info name="CPUModel" value="{m["cpu_model"]}"/>')
        grouped = len(p["nodes"]) > 1
        for n in p["nodes"]:
            ncpus = sorted(c for core in n["cores"] for c in core)
            d = 3
            if grouped:
                g.out(d, f'<object type="Group" {sets(ncpus, [n["os"]])} gp_index="{g.gpi()}" kind="1000" subkind="0" dont_merge="0">')
                d += 1
            write_node(g, d, n, ncpus)
            for cache in n["caches"]:
                ccpus = sorted(c for core in cache for c in core)
                g.out(d, f'<object type="L3Cache" {sets(ccpus, [n["os"]])} gp_index="{g.gpi()}" '
                         f'cache_size="{m["l3_bytes"]}" depth="3" cache_linesize="64" cache_associativity="16" cache_type="0">')
                for core in cache:
                    g.out(d + 1, f'<object type="Core" os_index="{core[0]}" {sets(core, [n["os"]])} gp_index="{g.gpi()}">')
                    for pu in core:
                        g.out(d + 2, f'<object type="PU" os_index="{pu}" {sets([pu], [n["os"]])} gp_index="{g.gpi()}"/>')
                    g.out(d + 1, '</object>')
                g.out(d, '</object>')
            for root in n.get("pci_roots", []):
                write_pci_root(g, d, root)
            if grouped:
                g.out(3, '</object>')
        # hwloc wants memory children in node order: GPU memory nodes
        # (numbered after the CPU nodes) come last.
        for gm in p.get("gpu_memory_nodes", []):
            write_node(g, 3, gm, pcpus)
        for root in p.get("pci_roots", []):
            write_pci_root(g, 3, root)
        g.out(2, '</object>')
    for root in m.get("machine_pci_roots", []):
        write_pci_root(g, 2, root)
    g.out(1, '</object>')
    dist = m.get("distances")
    if dist:
        n = len(all_nodes)
        g.out(1, f'<distances2 type="NUMANode" nbobjs="{n}" kind="5" name="NUMALatency" indexing="os">')
        # hwloc's "length" is the length of the text, not the count.
        idx = " ".join(map(str, all_nodes)) + " "
        vals = " ".join(str(dist(a, b)) for a in all_nodes for b in all_nodes) + " "
        g.out(2, f'<indexes length="{len(idx)}">{idx}</indexes>')
        g.out(2, f'<u64values length="{len(vals)}">{vals}</u64values>')
        g.out(1, '</distances2>')
    g.out(0, '</topology>')
    with open(os.path.join(HERE, name), "w") as f:
        f.write("\n".join(g.lines) + "\n")


def write_node(g, d, n, cpus):
    sub = f' subtype="{n["subtype"]}"' if n.get("subtype") else ""
    g.out(d, f'<object type="NUMANode" os_index="{n["os"]}"{sub} {sets(cpus, [n["os"]])} '
             f'gp_index="{g.gpi()}" local_memory="{n["memory"]}"/>')


def write_pci_root(g, d, root):
    """root: {domain, bus_range, children: [switch or device]}"""
    g.out(d, f'<object type="Bridge" gp_index="{g.gpi()}" bridge_type="0-1" depth="0" '
             f'bridge_pci="{root["domain"]:04x}:[{root["lo"]:02x}-{root["hi"]:02x}]">')
    for ch in root["children"]:
        write_pci(g, d + 1, ch, 1)
    g.out(d, '</object>')


def write_pci(g, d, dev, depth):
    if dev.get("switch"):
        g.out(d, f'<object type="Bridge" gp_index="{g.gpi()}" bridge_type="1-1" depth="{depth}" '
                 f'bridge_pci="{dev["busid"][:4]}:[{dev["lo"]:02x}-{dev["hi"]:02x}]" pci_busid="{dev["busid"]}" '
                 f'pci_type="0604 [{dev["vendor"]}:{dev["device"]}] [{dev.get("sub", "0000:0000")}] 00" pci_link_speed="{dev.get("speed", 0.0):f}">')
        for ch in dev["children"]:
            write_pci(g, d + 1, ch, depth + 1)
        g.out(d, '</object>')
    else:
        g.out(d, f'<object type="PCIDev" gp_index="{g.gpi()}" pci_busid="{dev["busid"]}" '
                 f'pci_type="{dev["class"]} [{dev["vendor"]}:{dev["device"]}] [{dev["vendor"]}:0000] a1" '
                 f'pci_link_speed="{dev.get("speed", 0.0):f}">')
        if dev.get("name"):
            g.out(d + 1, f'<info name="PCIDevice" value="{dev["name"]}"/>')
        for od in dev.get("osdevs", []):
            write_osdev(g, d + 1, od)
        g.out(d, '</object>')


# hwloc's OS device types in XML: 0 block (storage), 2 network, 3 OpenFabrics.
OSDEV_BLOCK, OSDEV_NETWORK, OSDEV_OPENFABRICS = 0, 2, 3


def write_osdev(g, d, od):
    """od: {name, type (OSDEV_*), subtype (optional), infos: [(name, value)]}"""
    sub = f' subtype="{od["subtype"]}"' if od.get("subtype") else ""
    g.out(d, f'<object type="OSDev" gp_index="{g.gpi()}" name="{od["name"]}"{sub} osdev_type="{od["type"]}">')
    for k, v in od.get("infos", []):
        g.out(d + 1, f'<info name="{k}" value="{v}"/>')
    g.out(d, '</object>')


def smt_cores(first_core, count, threads_offset, smt=True):
    """Cores numbered like Linux does on x86 with SMT: core k has PUs k and k+offset."""
    return [[c, c + threads_offset] if smt else [c] for c in range(first_core, first_core + count)]


def gpu(busid, device, name, speed=31.5, cls="0302"):
    return {"busid": busid, "class": cls, "vendor": "10de", "device": device, "name": name, "speed": speed}


def nic(busid):
    return {"busid": busid, "class": "0207", "vendor": "15b3", "device": "101b", "name": "MT28908 Family [ConnectX-6]", "speed": 31.5}


def switch(busid, lo, hi, children, device="c010"):
    return {"switch": True, "busid": busid, "lo": lo, "hi": hi, "vendor": "1000", "device": device, "children": children}


def bridge(busid, lo, hi, children, vendor, device, sub="0000:0000", speed=0.0):
    """A PCI-PCI bridge: a root port, or a switch's upstream or downstream port."""
    return {"switch": True, "busid": busid, "lo": lo, "hi": hi, "vendor": vendor, "device": device, "sub": sub,
            "speed": speed, "children": children}


def ib_osdevs(verbs, netdev, guid, lid, port_state=4):
    """A ConnectX port as hwloc shows it: the verbs device (with its port's
    state, 4 = active, and LID) and the IPoIB interface (20-byte address)."""
    return [{"name": verbs, "type": OSDEV_OPENFABRICS,
             "infos": [("NodeGUID", guid), ("SysImageGUID", guid), ("Port1State", str(port_state)),
                       ("Port1LID", lid), ("Port1LMC", "0")]},
            {"name": netdev, "type": OSDEV_NETWORK,
             "infos": [("Address", "00:00:10:29:fe:80:00:00:00:00:00:00:" + ":".join(
                 guid.replace(":", "")[i:i + 2] for i in range(0, 16, 2))), ("Port", "1")]}]


def roce_osdevs(verbs, netdev, mac):
    """A ConnectX Ethernet port with RoCE: verbs device with LID 0, Ethernet interface."""
    return [{"name": verbs, "type": OSDEV_OPENFABRICS,
             "infos": [("Port1State", "4"), ("Port1LID", "0x0"), ("Port1LMC", "0")]},
            {"name": netdev, "type": OSDEV_NETWORK, "infos": [("Address", mac), ("Port", "1")]}]


# --- DGX A100-like: 2x AMD EPYC 7742 (64 cores, SMT2), NPS4 = 4 nodes per
# socket, 16 core complexes of 4 cores (16 MiB L3) per socket, 1 TiB, 8 A100
# SXM4 behind 4 PCIe switches. Published affinity: GPU0/1 -> node 3
# (48-63,176-191), GPU2/3 -> node 1, GPU4/5 -> node 7, GPU6/7 -> node 5.
def dgx_a100():
    pkgs = []
    a100 = "20b0"
    roots = {
        3: [(0x07, 0x0f, "0000:01:00.0")],
        1: [(0x47, 0x4e, "0000:41:00.0")],
        7: [(0x87, 0x90, "0000:81:00.0")],
        5: [(0xb7, 0xbd, "0000:b1:00.0")],
    }
    for s in range(2):
        nodes = []
        for k in range(4):
            nid = s * 4 + k
            first = nid * 16
            cores = smt_cores(first, 16, 128)
            caches = [cores[i:i + 4] for i in range(0, 16, 4)]
            pci = []
            for (b0, b1, sw) in roots.get(nid, []):
                bus = int(sw[5:7], 16)
                pci.append({"domain": 0, "lo": bus - 1, "hi": b1 + 8, "children": [
                    switch(sw, bus, b1 + 8, [gpu(f"0000:{b0:02x}:00.0", a100, "A100-SXM4-40GB"),
                                             gpu(f"0000:{b1:02x}:00.0", a100, "A100-SXM4-40GB"),
                                             nic(f"0000:{b0 + 5:02x}:00.0")])]})
            nodes.append({"os": nid, "memory": 128 * GIB, "cores": cores, "caches": caches, "pci_roots": pci})
        pkgs.append({"nodes": nodes})

    def dist(a, b):
        if a == b:
            return 10
        return 12 if a // 4 == b // 4 else 32
    write_machine("dgx-a100-nps4.xml", {"product": "DGXA100", "cpu_model": "AMD EPYC 7742 64-Core Processor",
                                        "l3_bytes": 16 << 20, "packages": pkgs, "distances": dist})


# --- DGX H100-like: 2x Intel Xeon Platinum 8480C (56 cores, SMT2), one node
# per socket, 105 MiB L3 per socket, 2 TiB, 8 H100 SXM5 (PCIe Gen5).
# Published affinity: GPU0-3 -> node 0 (0-55,112-167), GPU4-7 -> node 1.
# Published I/O (DGX H100 user guide and block diagram): each GPU shares a
# Broadcom PEX89000 Gen5 switch with one single-port ConnectX-7 (400 Gb/s
# InfiniBand, the compute fabric) and one U.2 NVMe data drive, four switches
# per socket; two dual-port ConnectX-7 (storage and in-band management, here
# as Ethernet with RoCE), one per socket, on a root port of their own. The
# PCIe chain is what lstopo shows: root bus, root port, switch upstream port,
# one downstream port per device. OS names follow the kernel's naming from
# the bus numbers; the real machine numbers its mlx5_N devices otherwise.
def dgx_h100():
    h100 = "2330"
    bus = [[0x18, 0x2a, 0x3a, 0x5d], [0x9a, 0xab, 0xba, 0xdb]]
    storage_bus = [0x40, 0xc0]
    pkgs = []
    for s in range(2):
        cores = smt_cores(s * 56, 56, 112)
        roots = []
        for k, b in enumerate(bus[s]):
            i = s * 4 + k
            guid = "a088:c203:00%02x:0001" % i
            devices = [gpu(f"0000:{b:02x}:00.0", h100, "H100 80GB HBM3", 63.0),
                       {"busid": f"0000:{b + 1:02x}:00.0", "class": "0207", "vendor": "15b3", "device": "1021",
                        "name": "MT2910 Family [ConnectX-7]", "speed": 63.0,
                        "osdevs": ib_osdevs(f"mlx5_{i}", f"ibp{b + 1}s0", guid, "0x%x" % (i + 1))},
                       {"busid": f"0000:{b + 2:02x}:00.0", "class": "0108", "vendor": "144d", "device": "a824",
                        "name": "NVMe SSD Controller PM173X", "speed": 7.88,
                        "osdevs": [{"name": f"nvme{i}n1", "type": OSDEV_BLOCK, "subtype": "Disk",
                                    "infos": [("Size", "3750000000"), ("SectorSize", "512"), ("Type", "Disk")]}]}]
            downstream = [bridge(f"0000:{b - 1:02x}:{j:02x}.0", b + j, b + j, [dev], "1000", "c030", "1000:0000", 63.0)
                          for j, dev in enumerate(devices)]
            upstream = bridge(f"0000:{b - 2:02x}:00.0", b - 1, b + 2, downstream, "1000", "c030", "1000:0000", 63.0)
            root_port = bridge(f"0000:{b - 3:02x}:01.0", b - 2, b + 2, [upstream], "8086", "352a", speed=63.0)
            roots.append({"domain": 0, "lo": b - 3, "hi": b + 2, "children": [root_port]})
        sb = storage_bus[s]
        functions = [{"busid": f"0000:{sb + 1:02x}:00.{f}", "class": "0200", "vendor": "15b3", "device": "1021",
                      "name": "MT2910 Family [ConnectX-7]", "speed": 63.0,
                      "osdevs": roce_osdevs(f"mlx5_{8 + 2 * s + f}", f"enp{sb + 1}s0f{f}np{f}",
                                            "b8:3f:d2:00:%02x:%02x" % (s, f))} for f in range(2)]
        roots.append({"domain": 0, "lo": sb, "hi": sb + 1, "children": [
            bridge(f"0000:{sb:02x}:01.0", sb + 1, sb + 1, functions, "8086", "352a", speed=63.0)]})
        pkgs.append({"nodes": [{"os": s, "memory": 1024 * GIB, "cores": cores, "caches": [cores], "pci_roots": roots}]})
    write_machine("dgx-h100.xml", {"product": "DGXH100", "cpu_model": "Intel(R) Xeon(R) Platinum 8480C",
                                   "l3_bytes": 105 << 20, "packages": pkgs,
                                   "distances": lambda a, b: 10 if a == b else 21})


# --- 2-socket PCIe server (Supermicro 4029GP-TRT class): 2x Xeon Gold 6248
# (20 cores, SMT2), 8 PCIe V100 behind two PLX switches per socket, one GPU's
# link trained down to x8. One ConnectX-6 InfiniBand HCA, in the slot of the
# first switch of socket 1 (so GPUs 4-5 share its switch, GPUs 6-7 reach it
# through another root of the same socket, GPUs 0-3 across the socket link);
# on socket 0's first root bus the chipset's SATA controller (the boot
# drive) and the onboard dual 10GBase-T.
def pcie_switch_server():
    v100 = "1db4"
    pkgs = []
    layout = [[(0x1a, [0x1b, 0x1c]), (0x3d, [0x3e, 0x3f])], [(0x88, [0x89, 0x8a]), (0xb1, [0xb2, 0xb3])]]
    for s in range(2):
        cores = smt_cores(s * 20, 20, 40)
        roots = []
        if s == 0:
            roots.append({"domain": 0, "lo": 0x00, "hi": 0x01, "children": [
                {"busid": "0000:00:17.0", "class": "0106", "vendor": "8086", "device": "a182",
                 "name": "C620 Series Chipset Family SATA Controller [AHCI mode]",
                 "osdevs": [{"name": "sda", "type": OSDEV_BLOCK, "subtype": "Disk",
                             "infos": [("Size", "468851544"), ("Type", "Disk")]}]},
                bridge("0000:00:1c.0", 0x01, 0x01, [
                    {"busid": f"0000:01:00.{f}", "class": "0200", "vendor": "8086", "device": "1563",
                     "name": "Ethernet Controller 10G X550T", "speed": 7.88,
                     "osdevs": [{"name": f"eno{f + 1}", "type": OSDEV_NETWORK,
                                 "infos": [("Address", "ac:1f:6b:00:00:%02x" % f), ("Port", "1")]}]}
                    for f in range(2)], "8086", "a190")]})
        for (sw, gb) in layout[s]:
            children = [gpu(f"0000:{b:02x}:00.0", v100, "Tesla V100-PCIE-32GB", 15.75 if b != 0x3f else 7.88) for b in gb]
            hi = gb[-1]
            if sw == 0x88:
                hi += 1
                children.append({"busid": f"0000:{hi:02x}:00.0", "class": "0207", "vendor": "15b3", "device": "101b",
                                 "name": "MT28908 Family [ConnectX-6]", "speed": 31.5,
                                 "osdevs": ib_osdevs("mlx5_0", "ib0", "9803:9b03:0001:0001", "0x2a")})
            roots.append({"domain": 0, "lo": sw - 1, "hi": hi, "children": [
                switch(f"0000:{sw:02x}:00.0", sw, hi, children, device="8747")]})
        pkgs.append({"nodes": [{"os": s, "memory": 192 * GIB, "cores": cores, "caches": [cores], "pci_roots": roots}]})
    write_machine("pcie-switch-2s.xml", {"product": "SYS-4029GP-TRT", "cpu_model": "Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz",
                                         "l3_bytes": 27 << 20 + 0, "packages": pkgs,
                                         "distances": lambda a, b: 10 if a == b else 21})


# --- Cloud VM, 2 vNUMA nodes, 4 GPUs whose sysfs numa_node is -1: the
# hypervisor gives no proximity, so hwloc hangs them off the whole machine.
def vm_two_nodes():
    pkgs = []
    for s in range(2):
        cores = smt_cores(s * 24, 24, 48)
        pkgs.append({"nodes": [{"os": s, "memory": 440 * GIB, "cores": cores, "caches": [cores]}]})
    root = {"domain": 1, "lo": 0, "hi": 0xff, "children": [
        gpu(f"0001:{b:02x}:00.0", "20b5", "A100-SXM4-80GB") for b in (0x00, 0x01, 0x02, 0x03)]}
    write_machine("cloud-vm-2n-nolocality.xml", {"product": "Virtual Machine", "cpu_model": "AMD EPYC 7V13 64-Core Processor",
                                                 "l3_bytes": 32 << 20, "packages": pkgs, "machine_pci_roots": [root],
                                                 "distances": lambda a, b: 10 if a == b else 20})


# --- Azure ND96asr v4 (the machine of ../shared/topologies/nccl/azure-ndv4-topo.xml),
# as hwloc sees it inside the VM: 2x AMD EPYC 7V12 giving 96 vCPUs in 4 vNUMA
# nodes of 24 (no SMT), 900 GiB; 8 A100 SXM4 40GB and 8 HDR InfiniBand VFs
# (ConnectX-6, 15b3:101c) on Hyper-V virtual PCI, each in a PCI domain of its
# own (GPUs 0001-0004 and 000b-000e, NICs 0101-0108). The hypervisor gives
# them no NUMA node (sysfs numa_node -1), so hwloc hangs them off the whole
# machine; Azure ships the NCCL topology file for that reason. Azure's images
# name the verbs devices mlx5_ib0-7, the IPoIB interfaces ib0-7.
def vm_ndv4():
    pkgs = []
    for s in range(2):
        nodes = []
        for k in range(2):
            nid = s * 2 + k
            cores = [[c] for c in range(nid * 24, nid * 24 + 24)]
            nodes.append({"os": nid, "memory": 225 * GIB, "cores": cores, "caches": [cores[i:i + 4] for i in range(0, 24, 4)]})
        pkgs.append({"nodes": nodes})
    roots = []
    for i, dom in enumerate([1, 2, 3, 4, 0xb, 0xc, 0xd, 0xe]):
        roots.append({"domain": dom, "lo": 0, "hi": 0, "children": [
            gpu(f"{dom:04x}:00:00.0", "20b0", "A100-SXM4-40GB")]})
    for i in range(8):
        dom = 0x101 + i
        roots.append({"domain": dom, "lo": 0, "hi": 0, "children": [
            {"busid": f"{dom:04x}:00:00.0", "class": "0207", "vendor": "15b3", "device": "101c",
             "name": "MT28908 Family [ConnectX-6 Virtual Function]", "speed": 31.5,
             "osdevs": ib_osdevs(f"mlx5_ib{i}", f"ib{i}", "0015:5dff:fe33:%04x" % i, "0x%x" % (0x100 + i))}]})
    write_machine("cloud-vm-ndv4-nolocality.xml", {"product": "Virtual Machine", "cpu_model": "AMD EPYC 7V12 64-Core Processor",
                                                   "l3_bytes": 16 << 20, "packages": pkgs, "machine_pci_roots": roots,
                                                   "distances": lambda a, b: 10 if a == b else 12 if a // 2 == b // 2 else 32})


# --- Cloud VM with one node (the usual single-GPU instance): numa_node -1 as
# well, and node 0 is simply right.
def vm_one_node():
    cores = smt_cores(0, 8, 8)
    root = {"domain": 0, "lo": 0, "hi": 0xff, "children": [gpu("0000:00:05.0", "2335", "NVIDIA H200")]}
    write_machine("cloud-vm-1n.xml", {"product": "Virtual Machine", "cpu_model": "Intel(R) Xeon(R) Platinum 8468",
                                      "l3_bytes": 105 << 20,
                                      "packages": [{"nodes": [{"os": 0, "memory": 120 * GIB, "cores": cores, "caches": [cores]}]}],
                                      "machine_pci_roots": [root]})


# --- Grace Hopper (GH200) node: one Grace CPU (72 Neoverse V2 cores, no SMT,
# 114 MiB L3) with 480 GiB LPDDR5X as node 0; the H100's 96 GiB HBM3 as a
# CPU-less node 1 (hwloc subtype GPUMemory); nodes 2-8 exist for MIG memory
# and hold nothing until used.
def grace_hopper():
    cores = [[c] for c in range(72)]
    gpu_root = {"domain": 9, "lo": 0, "hi": 1, "children": [
        gpu("0009:01:00.0", "2342", "GH200 480GB", 63.0)]}
    extra = [{"os": n, "memory": 0} for n in range(2, 9)]
    write_machine("grace-hopper.xml", {
        "product": "GH200", "cpu_model": "Neoverse-V2", "l3_bytes": 114 << 20,
        "packages": [{"nodes": [{"os": 0, "memory": 480 * GIB, "cores": cores, "caches": [cores]}],
                      "gpu_memory_nodes": [{"os": 1, "memory": 96 * GIB, "subtype": "GPUMemory"}],
                      "pci_roots": [gpu_root]}],
        "extra_nodes": extra,
        "distances": lambda a, b: 10 if a == b else (80 if 0 in (a, b) and 1 in (a, b) else 120 if a != 0 and b != 0 else 80)})


# --- 2-socket machine whose second socket has no DIMMs: node 1 has CPUs but
# no memory (a memoryless node), and its GPU's buffers must live elsewhere.
def memoryless_node():
    pkgs = []
    for s in range(2):
        cores = smt_cores(s * 16, 16, 32)
        roots = [{"domain": 0, "lo": 0x80 * s, "hi": 0x80 * s + 0x10, "children": [
            gpu(f"0000:{0x80 * s + 1:02x}:00.0", "20f1", "A100-PCIE-40GB")]}]
        pkgs.append({"nodes": [{"os": s, "memory": 256 * GIB if s == 0 else 0, "cores": cores, "caches": [cores], "pci_roots": roots}]})
    write_machine("memoryless-node-2s.xml", {"product": "R750xa", "cpu_model": "Intel(R) Xeon(R) Gold 6338",
                                             "l3_bytes": 48 << 20, "packages": pkgs,
                                             "distances": lambda a, b: 10 if a == b else 20})


if __name__ == "__main__":
    dgx_a100()
    dgx_h100()
    pcie_switch_server()
    vm_two_nodes()
    vm_ndv4()
    vm_one_node()
    grace_hopper()
    memoryless_node()
