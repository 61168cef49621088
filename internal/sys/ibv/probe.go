package ibv

import "github.com/tecache/te/internal/errs"

// Probe loads libibverbs and lists the RDMA devices. It returns a
// NotSupported error saying why verbs cannot be used here: the library is
// missing, or it loaded but sees no device.
func Probe() ([]string, error) {
	l, err := Load()
	if err != nil {
		return nil, err
	}
	d, err := l.Devices()
	if err != nil {
		return nil, err
	}
	defer d.Free()
	if d.Len() == 0 {
		return nil, errs.New(errs.NotSupported, "ibv", "no RDMA device (%s loaded, ibv_get_device_list found none)", l.Path).
			WithHint("load the NIC's driver and ibverbs-providers, or add Soft-RoCE: rdma link add rxe0 type rxe netdev eth0")
	}
	names := make([]string, d.Len())
	for i := range names {
		names[i] = d.Name(i)
	}
	return names, nil
}
