package errs

// TransferLost means a handoff transfer is gone from the sidecar that held
// it: the sidecar restarted (a different instance answered) or no longer
// knows the id. The caller must not wait for it; it releases its blocks and
// retries or fails the request.
const TransferLost Code = 21

// ErrTransferLost matches every TransferLost error.
var ErrTransferLost = &Error{Code: TransferLost}

func init() { names[TransferLost] = "transfer lost" }
