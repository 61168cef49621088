// Package api describes te-sidecar's HTTP routes: each Route names its
// method and path, who may call it, its query parameters, the Go types of
// its JSON body and answer, and the refusals it may answer. The server
// builds its route table from Routes, refuses query parameters a route
// does not declare, decodes bodies strictly (Decode: an unknown field is
// refused by name) and serves the OpenAPI 3 document that Document makes
// from the same table, so the document cannot drift from what is served.
package api
