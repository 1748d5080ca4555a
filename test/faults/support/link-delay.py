#!/usr/bin/env python3
# A link's delay for the fault suite's test hosts, where the kernel has no netem (sch_netem): the
# packets an iptables rule sends to NFQUEUE queue QUEUE are let through DELAY_MS +/- JITTER_MS
# (uniform) after they arrived, each on its own (jitter reorders packets, as netem's does). It
# speaks netfilter's netlink protocol itself (nfnetlink_queue, copy mode meta: the packets are
# never copied out), so it needs nothing beyond the Python standard library. It runs inside the
# host's network namespace (the queue is the namespace's own) until it is killed.
#
#   link-delay.py QUEUE DELAY_MS JITTER_MS

import heapq
import random
import select
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
NFQNL_MSG_VERDICT_BATCH = 3
NLMSG_ERROR = 2
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NF_ACCEPT = 1

queue = int(sys.argv[1])
delay = float(sys.argv[2]) / 1000.0
jitter = float(sys.argv[3]) / 1000.0

sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
sock.bind((0, 0))
sequence = 0


def attribute(kind, payload):
    length = 4 + len(payload)
    return struct.pack('=HH', length, kind) + payload + b'\0' * ((4 - length % 4) % 4)


def send(message, attributes, flags=NLM_F_REQUEST):
    global sequence
    sequence += 1
    body = struct.pack('=BB', socket.AF_UNSPEC, 0) + struct.pack('!H', queue) + attributes
    sock.send(struct.pack('=IHHII', 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | message, flags, sequence, 0) + body)


def expect_ack():
    data = sock.recv(65536)
    length, kind = struct.unpack_from('=IH', data, 0)
    if kind == NLMSG_ERROR:
        (error,) = struct.unpack_from('=i', data, 16)
        if error != 0:
            sys.stderr.write(f'link-delay: netlink error {error}\n')
            sys.exit(1)


send(NFQNL_MSG_CONFIG, attribute(NFQA_CFG_CMD, struct.pack('!BBH', NFQNL_CFG_CMD_BIND, 0, socket.AF_INET)), NLM_F_REQUEST | NLM_F_ACK)
expect_ack()
send(NFQNL_MSG_CONFIG, attribute(NFQA_CFG_PARAMS, struct.pack('!IB', 0xFFFF, NFQNL_COPY_META)) + attribute(NFQA_CFG_QUEUE_MAXLEN, struct.pack('!I', 65536)), NLM_F_REQUEST | NLM_F_ACK)
expect_ack()
sys.stdout.write('ready\n')
sys.stdout.flush()

held = []
while True:
    timeout = max(0.0, held[0][0] - time.monotonic()) if held else None
    readable, _, _ = select.select([sock], [], [], timeout)
    if readable:
        try:
            data = sock.recv(1024 * 1024)
        except OSError:
            # ENOBUFS: the kernel dropped notifications (their packets are lost, as on a full link)
            data = b''
        offset = 0
        while offset + 16 <= len(data):
            length, kind = struct.unpack_from('=IH', data, offset)
            if length < 16:
                break
            if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                position = offset + 20
                while position + 4 <= offset + length:
                    attribute_length, attribute_kind = struct.unpack_from('=HH', data, position)
                    if attribute_length < 4:
                        break
                    if attribute_kind & 0x7FFF == NFQA_PACKET_HDR:
                        (packet,) = struct.unpack_from('!I', data, position + 4)
                        heapq.heappush(held, (time.monotonic() + max(0.0, random.uniform(delay - jitter, delay + jitter)), packet))
                        break
                    position += (attribute_length + 3) & ~3
            offset += (length + 3) & ~3
    now = time.monotonic()
    if jitter == 0:
        # Without jitter the packets leave in the order they came (queue ids rise): one batch
        # verdict for every packet due, up to the last of them.
        last = None
        while held and held[0][0] <= now:
            _, last = heapq.heappop(held)
        if last is not None:
            send(NFQNL_MSG_VERDICT_BATCH, attribute(NFQA_VERDICT_HDR, struct.pack('!II', NF_ACCEPT, last)))
    while held and held[0][0] <= now:
        _, packet = heapq.heappop(held)
        send(NFQNL_MSG_VERDICT, attribute(NFQA_VERDICT_HDR, struct.pack('!II', NF_ACCEPT, packet)))
