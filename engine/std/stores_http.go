//go:build !te_nohttpmeta

package std

import _ "github.com/tecache/te/engine/meta/http"
