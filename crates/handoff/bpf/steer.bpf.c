// SPDX-License-Identifier: (MIT OR Apache-2.0) AND GPL-2.0-only
//
// switchyard steering program: tc clsact ingress on the switch's interface.
//
// After a connection has been handed off, the client keeps sending its ACKs
// and requests to the virtual IP, which the switch owns. This program looks
// the packet's TCP 4-tuple up in `sy_steer` and, when an entry exists,
// rewrites the Ethernet addresses (destination: the node that now owns the
// connection, source: this interface) and redirects the frame out of the
// interface given in the entry, below the switch's TCP stack (the forwarder
// of seed 004 §4.2).
//
// A SYN (without ACK) for a 4-tuple that still has an entry means the client
// reuses the source port of a closed connection: the stale entry is deleted
// and the SYN goes up to the switch's stack, so the new connection is
// accepted and dispatched normally (seed 004 §4.2, port reuse).
//
// The map layout is mirrored in crates/handoff/src/steer/ebpf.rs.
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

struct sy_key {
	__u32 saddr; /* client address, network order */
	__u32 daddr; /* virtual IP, network order */
	__u16 sport; /* client port, network order */
	__u16 dport; /* service port, network order */
};

struct sy_val {
	__u8 dmac[6];    /* the node's MAC */
	__u8 smac[6];    /* the outgoing interface's MAC */
	__u32 ifindex;   /* outgoing interface; 0 = the one the packet came in on */
	__u64 packets;   /* packets forwarded through this entry */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__type(key, struct sy_key);
	__type(value, struct sy_val);
} sy_steer SEC(".maps");

/* 0: packets forwarded, 1: stale entries removed by a SYN, 2: packets passed. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} sy_stats SEC(".maps");

static __always_inline void count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&sy_stats, &idx);
	if (v)
		__sync_fetch_and_add(v, 1);
}

SEC("tc")
int sy_steer_ingress(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip;
	struct tcphdr *tcp;
	struct sy_key key;
	struct sy_val *val;
	__u32 ihl;

	if ((void *)(eth + 1) > end)
		return TC_ACT_OK;
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return TC_ACT_OK;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end)
		return TC_ACT_OK;
	if (ip->protocol != IPPROTO_TCP)
		return TC_ACT_OK;
	/* Later fragments carry no TCP header. */
	if (ip->frag_off & bpf_htons(0x1fff))
		return TC_ACT_OK;
	ihl = ip->ihl * 4;
	if (ihl < sizeof(*ip))
		return TC_ACT_OK;
	tcp = (void *)ip + ihl;
	if ((void *)(tcp + 1) > end)
		return TC_ACT_OK;

	key.saddr = ip->saddr;
	key.daddr = ip->daddr;
	key.sport = tcp->source;
	key.dport = tcp->dest;

	if (tcp->syn && !tcp->ack) {
		if (bpf_map_delete_elem(&sy_steer, &key) == 0)
			count(1);
		return TC_ACT_OK;
	}

	val = bpf_map_lookup_elem(&sy_steer, &key);
	if (!val) {
		count(2);
		return TC_ACT_OK;
	}
	__builtin_memcpy(eth->h_dest, val->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, val->smac, ETH_ALEN);
	__sync_fetch_and_add(&val->packets, 1);
	count(0);
	return bpf_redirect(val->ifindex ? val->ifindex : skb->ifindex, 0);
}

char LICENSE[] SEC("license") = "GPL";
