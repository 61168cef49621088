package kvcache

// HeadRange returns the KV heads that tensor-parallel rank `rank` of
// `tpSize` holds in a model with totalHeads KV heads, the way vLLM and
// SGLang shard them: with tpSize <= totalHeads each rank holds
// totalHeads/tpSize consecutive heads; with more ranks than heads the heads
// are replicated and rank r holds the single head r*totalHeads/tpSize. The
// sizes must divide evenly.
func HeadRange(totalHeads, tpSize, rank int) (start, n int, err error) {
	switch {
	case totalHeads <= 0 || totalHeads >= limit || tpSize <= 0 || tpSize >= limit:
		return 0, 0, invalid("head range: total_heads %d and tp size %d must be positive", totalHeads, tpSize)
	case rank < 0 || rank >= tpSize:
		return 0, 0, invalid("head range: rank %d outside 0..%d", rank, tpSize-1)
	case tpSize <= totalHeads && totalHeads%tpSize != 0:
		return 0, 0, invalid("head range: %d KV heads do not divide over %d ranks", totalHeads, tpSize)
	case tpSize > totalHeads && tpSize%totalHeads != 0:
		return 0, 0, invalid("head range: %d ranks do not replicate %d KV heads evenly", tpSize, totalHeads)
	}
	if tpSize <= totalHeads {
		n = totalHeads / tpSize
		return rank * n, n, nil
	}
	return rank / (tpSize / totalHeads), 1, nil
}

// SourceRanks returns the source ranks (of srcTP) a destination rank (of
// dstTP) must receive from to get all its heads, in head order, with one
// plan per source rank. When the decode side has more ranks (the usual
// case), that is the one prefill rank whose heads include the decode rank's;
// vLLM's connectors pair decode rank r with prefill rank r/(dstTP/srcTP) and
// copy a head slice of each block. When the prefill side has more ranks,
// each decode rank gathers from several. Replicated heads (more ranks than
// heads) are taken from one holder, chosen by dstRank to spread the load.
func SourceRanks(totalHeads, srcTP, dstTP, dstRank int) ([]int, error) {
	ds, dn, err := HeadRange(totalHeads, dstTP, dstRank)
	if err != nil {
		return nil, err
	}
	if _, _, err := HeadRange(totalHeads, srcTP, 0); err != nil {
		return nil, err
	}
	var out []int
	for s := 0; s < srcTP; {
		ss, sn, _ := HeadRange(totalHeads, srcTP, s)
		// Ranks s .. s+k-1 hold the same heads when they are replicated.
		k := 1
		for s+k < srcTP {
			x, _, _ := HeadRange(totalHeads, srcTP, s+k)
			if x != ss {
				break
			}
			k++
		}
		if ss < ds+dn && ds < ss+sn {
			out = append(out, s+dstRank%k)
		}
		s += k
	}
	return out, nil
}
