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
