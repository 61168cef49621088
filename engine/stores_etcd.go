//go:build !te_noetcd

package engine

import _ "github.com/tecache/te/engine/meta/etcd"
