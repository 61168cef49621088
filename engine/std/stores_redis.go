//go:build !te_noredis

package std

import _ "github.com/tecache/te/engine/meta/redis"
