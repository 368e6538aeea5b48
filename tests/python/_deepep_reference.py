"""DeepEP's intranode dispatch handle in plain Python, as its kernels define each entry (notify_dispatch and
dispatch in csrc/kernels/legacy/intranode.cu, channel ranges from get_channel_task_range): the oracle of the
drop-in's handle entries (tests/python/test_deepep_handle_cpu.py, test_deepep_ranks.py). Inputs are nested lists:
in_rank[s][t][d] says whether token t of rank s goes to rank d."""


def channel_range(num_tokens, num_channels, c):
    """Tokens [begin, end) of channel c: ceil(T / C) a channel, the last ones clipped (possibly empty)."""
    per = -(-num_tokens // num_channels)
    begin = min(per * c, num_tokens)
    return begin, min(begin + per, num_tokens)


def channel_prefix_matrix(in_rank_s, num_ranks, num_channels):
    """[d][c]: tokens of this rank in channels 0..c that go to rank d."""
    out = []
    for d in range(num_ranks):
        row, total = [], 0
        for c in range(num_channels):
            begin, end = channel_range(len(in_rank_s), num_channels, c)
            total += sum(1 for t in range(begin, end) if in_rank_s[t][d])
            row.append(total)
        out.append(row)
    return out


def send_head(in_rank_s, num_ranks, num_channels):
    """[t][d]: the sender's queue tail for rank d in t's channel when it reaches t (tokens of the channel before t
    that went to d), -1 where t does not go to d."""
    out = [[-1] * num_ranks for _ in in_rank_s]
    for d in range(num_ranks):
        for c in range(num_channels):
            tail = 0
            begin, end = channel_range(len(in_rank_s), num_channels, c)
            for t in range(begin, end):
                if in_rank_s[t][d]:
                    out[t][d] = tail
                    tail += 1
    return out


def handle(in_rank, me, num_channels, rows=None):
    """Rank me's (rank_prefix_matrix, channel_prefix_matrix, recv_channel_prefix_matrix, recv_src_idx, send_head) as
    lists; recv_src_idx is padded with -1 to `rows` when given (worst-case outputs)."""
    r = len(in_rank)
    rank_prefix, running = [], [0] * r
    for s in range(r):
        running = [running[d] + sum(1 for tok in in_rank[s] if tok[d]) for d in range(r)]
        rank_prefix.append(running)
    recv_channel_prefix, recv_src_idx = [], []
    for s in range(r):  # the receiver's warps for source s, channel by channel, each channel's rows in token order
        sender = channel_prefix_matrix(in_rank[s], r, num_channels)[me]
        recv_channel_prefix.append([0] + sender[:-1])
        for c in range(num_channels):
            begin, end = channel_range(len(in_rank[s]), num_channels, c)
            recv_src_idx += [t for t in range(begin, end) if in_rank[s][t][me]]
    if rows is not None:
        assert rows >= len(recv_src_idx)
        recv_src_idx += [-1] * (rows - len(recv_src_idx))
    return (rank_prefix, channel_prefix_matrix(in_rank[me], r, num_channels), recv_channel_prefix, recv_src_idx,
            send_head(in_rank[me], r, num_channels))


def internode_handle(in_rank, me, num_channels, rows=None):
    """Rank me's DeepEP internode handle entries (R = 8 N ranks; csrc/kernels/legacy/internode.cu's notify_dispatch,
    dispatch and their SourceMeta), as lists, is_token_in_rank aside: (rdma_channel_prefix_matrix,
    gbl_channel_prefix_matrix, recv_rdma_channel_prefix_matrix, recv_rdma_rank_prefix_sum,
    recv_gbl_channel_prefix_matrix, recv_gbl_rank_prefix_sum, recv_src_meta as (source node, bits) pairs,
    send_rdma_head, send_nvl_head). recv_src_meta is padded with (-1, 0) to `rows` when given."""
    r = len(in_rank)
    nodes, peers = r // 8, 8
    n, lane = divmod(me, peers)

    def to_nodes(in_rank_s):  # token t goes to node m: to any of its ranks
        return [[any(tok[m * peers:(m + 1) * peers]) for m in range(nodes)] for tok in in_rank_s]

    rdma_prefix = channel_prefix_matrix(to_nodes(in_rank[me]), nodes, num_channels)
    gbl_prefix = channel_prefix_matrix(in_rank[me], r, num_channels)
    recv_rdma_channel, recv_rdma_rank, total = [], [], 0
    for m in range(nodes):  # rank (m, lane) forwards its tokens for node n through me
        row = channel_prefix_matrix(to_nodes(in_rank[m * peers + lane]), nodes, num_channels)[n]
        recv_rdma_channel.append(row)
        total += row[-1]
        recv_rdma_rank.append(total)
    recv_gbl_rank, recv_gbl_channel, meta, total = [], [], [], 0
    for g in range(r):
        sender = channel_prefix_matrix(in_rank[g], r, num_channels)[me]
        recv_gbl_channel.append([total] + [total + v for v in sender[:-1]])
        for t, tok in enumerate(in_rank[g]):
            if tok[me]:
                meta.append((g // peers, sum(1 << j for j in range(peers) if tok[n * peers + j])))
        total += sender[-1]
        recv_gbl_rank.append(total)
    if rows is not None:
        assert rows >= len(meta)
        meta += [(-1, 0)] * (rows - len(meta))
    send_nvl_head = []
    for m in range(nodes):
        src = in_rank[m * peers + lane]
        for c in range(num_channels):
            begin, end = channel_range(len(src), num_channels, c)
            seen = [0] * peers
            for t in range(begin, end):
                if not any(src[t][n * peers:(n + 1) * peers]):
                    continue
                row = []
                for j in range(peers):
                    row.append(seen[j] if src[t][n * peers + j] else -1)
                    seen[j] += src[t][n * peers + j]
                send_nvl_head.append(row)
    return (rdma_prefix, gbl_prefix, recv_rdma_channel, recv_rdma_rank, recv_gbl_channel, recv_gbl_rank, meta,
            send_head(to_nodes(in_rank[me]), nodes, num_channels), send_nvl_head)
