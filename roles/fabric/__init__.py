"""The InfiniBand fabric: MLNX_OFED (mofed), the IPoIB interface (ipoib). Files: files/fabric/."""
