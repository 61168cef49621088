package session_test

import (
	"bytes"
	"fmt"

	"github.com/tecache/te/internal/session"
)

// Example seals a frame header and a payload on one end and opens them on
// the other. The keys come from the exchange (internal/peerauth's
// ClientSession and ServerSession call New); here both ends are built from
// the same parameters.
func Example() {
	p := session.Params{
		Secret:     []byte("a cluster secret of 32 bytes..."),
		Transcript: []byte("the HELLO and CHALLENGE bodies, as sent"),
		Channel:    session.Data,
		Mode:       session.Encryption,
	}
	initiator, _ := session.New(p, session.Initiator)
	target, _ := session.New(p, session.Server)

	var conn bytes.Buffer // a TCP connection in real life
	hdr, _ := initiator.Send.Seal(nil, []byte("WRITE 12 bytes"))
	conn.Write(hdr)
	initiator.Send.WritePayload(&conn, []byte("KV block 42."), nil)
	fmt.Println(conn.Len(), "bytes on the wire")

	got, err := target.Recv.ReadRecord(&conn, make([]byte, 64), len("WRITE 12 bytes"))
	fmt.Printf("%s %v\n", got, err)
	payload := make([]byte, 12)
	err = target.Recv.ReadPayload(&conn, payload, nil)
	fmt.Printf("%s %v\n", payload, err)
	// Output:
	// 58 bytes on the wire
	// WRITE 12 bytes <nil>
	// KV block 42. <nil>
}
