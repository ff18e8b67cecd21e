"""``vnetd render KIND`` and ``vnetd hosts``: ``command`` (the parsers and the runs of
the spec's kinds), ``cluster`` (``minicluster``, ``monitoring``) and ``members`` (the
one registry read ``wg-quick`` needs); the renderers are ``vnetd.render``."""
