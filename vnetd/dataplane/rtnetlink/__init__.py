"""The device's link, addresses and routes, for both real data planes: the one write
path (``link``, ``fail_closed``, ``route_mtu`` over ``link_socket``; the peers'
routes over ``route_socket``), the routes following each plan (``linked_device``),
and the reads and host probes through pyroute2 (``link_reads``, with
``pyroute2_package``). See docs/architecture.md, "Data plane and routing"."""
