"""The node's model cache: the node agent (`modelserve-nodecache`, a DaemonSet beside the operator)
and the fetch client (`modelserve-fetch`, each model pod's init container). The fifth program: it
imports only `contracts/` of this package, and no other program imports it."""
