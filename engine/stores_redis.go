//go:build !te_noredis

package engine

import _ "github.com/tecache/te/engine/meta/redis"
