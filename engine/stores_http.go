//go:build !te_nohttpmeta

package engine

import _ "github.com/tecache/te/engine/meta/http"
