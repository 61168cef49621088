package segment

// IsMooncake reports whether d was published by a Mooncake Transfer Engine
// rather than by te: it carries none of te's identity fields (an instance,
// a transport list, endpoints). Such a peer is reached over tcp at its RPC host (RPC,
// filled in by whoever fetched d) and its tcp_data_port, in Mooncake's data
// framing.
func (d *Desc) IsMooncake() bool {
	return d.Instance == "" && len(d.Transports) == 0 && len(d.Endpoints) == 0
}

// ForMooncake returns the view of d given to a Mooncake peer: no capability
// keys or transport extras (a Mooncake peer never authenticates, and does not
// use them), protocol "tcp" (the one transport both speak) with the
// acknowledged data framing. te's other fields stay: Mooncake ignores them,
// and a te engine that reads this view knows it from a Mooncake one.
func (d *Desc) ForMooncake() *Desc {
	c := d.Clone()
	c.Protocol = "tcp"
	c.Devices = nil
	if c.TCPDataPort > 0 {
		c.TCPProtoVersion = 2
	}
	for i := range c.Buffers {
		b := &c.Buffers[i]
		b.Key, b.Extra = 0, nil
		b.Rkey, b.Lkey = []uint32{}, []uint32{}
	}
	return c
}
