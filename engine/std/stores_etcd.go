//go:build !te_noetcd

package std

import _ "github.com/tecache/te/engine/meta/etcd"
