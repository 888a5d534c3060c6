"""The InfiniBand fabric: MLNX_OFED (mofed), the IPoIB interface (ipoib), the subnet manager
(opensm, on one node when cluster.yaml names it). Files: files/fabric/."""
