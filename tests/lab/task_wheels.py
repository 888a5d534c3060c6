"""The Python packages in the lab's task images: Determined's harness, `determined` 0.38.0 (the
version of the master and of this project's own CLI), and everything its wheel Requires, as
pip resolves them for CPython 3.11 on x86_64 Linux (the images' Debian 12 python3), wheels
only, each pinned by sha256 (pip download --require-hashes checks them).

Determined installs the same wheel into every task container at start (master/static/srv/
task-setup.sh: `pip install --user /opt/determined/wheels/determined*.whl`), so that a task
image needs Python and the harness's requirements; the lab's images carry both, installed when
the image is built. boto3, botocore and s3transfer stay at their mid-2024 versions (the real
task images were built in July 2024): from boto3 1.36 the default request checksums
(aws-chunked trailers) are ones older S3 servers reject; with them urllib3 2.2.3, jmespath
1.0.1, six 1.16.0 and python-dateutil 2.9.0.post0, the images' earlier pins. Every other one
is at the version this project's own environment runs the `det` CLI with (its `pip freeze`,
as constraints of `pip download determined==0.38.0`, on 2026-12-02).

Binary wheels name manylinux tags up to manylinux_2_34 (cryptography, bcrypt, pynacl): the
build machine's and the image's glibc (Debian 12: 2.36) satisfy them.
"""

WHEELS_PINNED = {
    "analytics_python-1.4.post1-py2.py3-none-any.whl": (
        "33ab660150d0f37bb2fefc93fd19c9e7bd85e5b17db44df5e7e1139f63c14246"
    ),
    "appdirs-1.4.4-py2.py3-none-any.whl": "a841dacd6b99318a741b166adb07e19ee71a274450e68237b4650ca1055ab128",
    "argcomplete-3.7.2-py3-none-any.whl": "6029205678bdd9c1c728a155f5f9ecf5812393f969eef58807641a2bc2aa5b19",
    "azure_core-1.41.0-py3-none-any.whl": "522b4011e8180b1a3dcd2024396a4e7fe9ac37fb8597db47163d230b5efe892d",
    "azure_storage_blob-12.31.1-py3-none-any.whl": (
        "9e012d5f4ab658b7cb8a4581329d7a7aa2bf5f39b4d63baeefaae7f9e90fe6f0"
    ),
    "backoff-1.10.0-py2.py3-none-any.whl": "5e73e2cbe780e1915a204799dba0a01896f45f4385e636bcca7a0614d879d0cd",
    "bcrypt-5.0.0-cp39-abi3-manylinux_2_34_x86_64.whl": (
        "611f0a17aa4a25a69362dcc299fda5c8a3d4f160e2abb3831041feb77393a14a"
    ),
    "boto3-1.34.162-py3-none-any.whl": "d6f6096bdab35a0c0deff469563b87d184a28df7689790f7fe7be98502b7c590",
    "botocore-1.34.162-py3-none-any.whl": "2d918b02db88d27a75b48275e6fb2506e9adaaddbec1ffa6a8a0898b34e769be",
    "certifi-2026.10.19.post1-py3-none-any.whl": (
        "1324c476b4811eff41a8bc2122cd0bbd4d9c7234c725446d99ab1612b3a7fdd2"
    ),
    "cffi-2.1.1-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl": (
        "34e261f78cb6ceaaa36f42f2613f4380d94d9c759a9c73c769ee6e0247364632"
    ),
    "charset_normalizer-3.5.3-cp311-cp311-manylinux1_x86_64.manylinux_2_28_x86_64.manylinux_2_5_x86_64.whl": (
        "2a6f937e0b70133d1f826d0a253331b6fe1a4c874808cc12e16f2fb8177042f4"
    ),
    "contourpy-1.3.3-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl": (
        "51e79c1f7470158e838808d4a996fa9bac72c498e93d8ebe5119bc1e6becb0db"
    ),
    "cryptography-50.0.2-cp311-abi3-manylinux_2_34_x86_64.whl": (
        "9dab55f57c74c3cad24c323bacbbd04be4705ba6eb0d92e920b1fc4837ed5079"
    ),
    "cycler-0.12.1-py3-none-any.whl": "85cef7cff222d8644161529808465972e51340599459b8ac3ccbac5a854e0d30",
    "determined-0.38.0-py3-none-any.whl": "371c600e8a3537e6457ed109859d3dc41385382259a492b5fced5d4158c5772e",
    "docker-7.2.0-py3-none-any.whl": "a3f45fdeb9165e2d25d9a1d02ddf3bc70fb572cf5ebbf9b58558c22caf29b71f",
    "filelock-4.3.1-py3-none-any.whl": "79e43df8e9fe509cd83a3899a7c186c8077cbbe4d200a1ed3705c2f3bb6bc487",
    "fonttools-4.68.0-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl": (
        "4b9c89b5876f1a74b1341632dfaf4c4c2be565d76c060445df401ebe7a4ceefa"
    ),
    "gitdb-4.0.12-py3-none-any.whl": "67073e15955400952c6565cc3e707c554a4eea2e428946f7a4c162fab9bd9bcf",
    "gitpython-3.2.1-py3-none-any.whl": "d66b0832aa8755c1a84892937282df0befb16c97e5a64aeebd68be9c5e323f53",
    "google_api_core-2.30.3-py3-none-any.whl": (
        "a85761ba72c444dad5d611c2220633480b2b6be2521eca69cca2dbb3ffd6bfe8"
    ),
    "google_api_python_client-2.202.0-py3-none-any.whl": (
        "aaa90064c9bb642ff1d065b22ca8958a2cb6e345909cefe70d0e5452fc50e08b"
    ),
    "google_auth-2.63.0-py3-none-any.whl": "cbc065325f67511946d1a66672e4f47e71ed162ef1abd2bb8404ceec407c86ba",
    "google_auth_httplib2-0.4.4-py3-none-any.whl": (
        "bbe5d7b2401bb3a4017f4720e1e91bd273ab9a2bb60b84e65edbc0de127852da"
    ),
    "google_cloud_core-2.8.0-py3-none-any.whl": (
        "e235b0952f7ffe7b9c71a4cf96b506d9cfb557e22557c412f0df9b7068b5d007"
    ),
    "google_cloud_storage-3.17.1-py3-none-any.whl": (
        "287c7919d7bcda710eae6f6b60c756e89140475d9a4daec01b6174e737488ca8"
    ),
    "google_crc32c-1.9.0-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl": (
        "86764b99e7a607830d93cb5b75e0ec3ff6cb06d3c274624418473cee701900d4"
    ),
    "google_resumable_media-2.11.0-py3-none-any.whl": (
        "f43d15e6a7f818f762eaead0f369c551f8275a4179c9d6225d0d259f49b87b5d"
    ),
    "googleapis_common_protos-1.76.0-py3-none-any.whl": (
        "59e13344a9f3651aa201a03e2bee815a3bf43a4baf1f9ff8a9b62a840ce25fac"
    ),
    "httplib2-0.32.1-py3-none-any.whl": "82e7a6ab08fcb27879864ddf63dbb529fb032ca336c331cb1597d6dd8b47c92e",
    "idna-3.20-py3-none-any.whl": "ab7ae7122974553370f0bdb919e1a960b2cd1bc1ef0276416d896db81c14582c",
    "invoke-3.0.3-py3-none-any.whl": "f11327165e5cbb89b2ad1d88d3292b5113332c43b8553b494da435d6ec6f5053",
    "isodate-0.7.2-py3-none-any.whl": "28009937d8031054830160fce6d409ed342816b543597cece116d966c6d99e15",
    "jmespath-1.0.1-py3-none-any.whl": "02e2e4cc71b5bcab88332eebf907519190dd9e6e82107fa7f83b1003a6252980",
    "kiwisolver-1.5.1-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl": (
        "95a02752aa032eef4aed01cda6d9b687c669bd0396bf4519eef8bba22a286720"
    ),
    "lomond-0.3.4-py2.py3-none-any.whl": "a63de62d1887e5038f51ce79b6aedbf31d4cac6e7cb135f592ddec9fff6a53cd",
    "matplotlib-3.11.2-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl": (
        "07d9b9fa60cd4c393692f50d0bb03123242ddf61c99bb0e95e75feb354e7c1a8"
    ),
    "monotonic-1.6-py2.py3-none-any.whl": "68687e19a14f11f26d140dd5c86f3dba4bf5df58003000ed467e0e2a69bca96c",
    "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl": (
        "89cd468399cfd2504718f0ba50e410dca55a170b61a02ad92bb18c8a65186e93"
    ),
    "packaging-26.4-py3-none-any.whl": "81383611a09c1bc0b08b76e0fd5829d7c6824c65b27a6aee339da133f4233ea2",
    "paramiko-4.0.0-py3-none-any.whl": "0e20e00ac666503bf0b4eda3b6d833465a2b7aff2e2b3d79a8bba5ef144ee3b9",
    "pathspec-1.1.1-py3-none-any.whl": "a00ce642f577bf7f473932318056212bc4f8bfdf53128c78bbd5af0b9b20b189",
    "pillow-13.0.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl": (
        "a625df9a2a5597fa5e5266e01aefc82604bb85d291e3547981e863560d75da6c"
    ),
    "proto_plus-1.29.0-py3-none-any.whl": "8acd070469a7aaf43f440b022ef9757c8cac1a9f866e933f59ae98669ddc6c8b",
    "protobuf-7.36.2-cp310-abi3-manylinux2014_x86_64.whl": (
        "89f23aa53c24553a2416fd4fd1ec06f74fa42b14b546d8883128813f775bbfd2"
    ),
    "psutil-7.2.2-cp36-abi3-manylinux2010_x86_64.manylinux_2_12_x86_64.manylinux_2_28_x86_64.whl": (
        "076a2d2f923fd4821644f5ba89f059523da90dc9014e85f8e45a5774ca5bc6f9"
    ),
    "pyasn1-0.6.5-py3-none-any.whl": "4017b0fce125096b8573b39c989fdb1a4b19cf761e683398184550fea0e66587",
    "pyasn1_modules-0.4.2-py3-none-any.whl": (
        "29253a9207ce32b64c3ac6600edc75368f98473906e8fd1043bd6b5b1de2c14a"
    ),
    "pycparser-3.12-py3-none-any.whl": "a076f3f489b39b43ed13563a1dafe42447445bec2e294154ec5c57fcdda4c85e",
    "pynacl-1.6.2-cp38-abi3-manylinux_2_34_x86_64.whl": (
        "c8a231e36ec2cab018c4ad4358c386e36eede0319a0c41fed24f840b1dac59f6"
    ),
    "pyopenssl-26.4.0-py3-none-any.whl": "f0eb0cb2d581d3ad2b9c489468485e7f2ab6727d08401bcf9d824c3caddf3c1c",
    "pyparsing-3.3.3-py3-none-any.whl": "ece8c00a69cf01b45d0b1dedabb469c90d8caf996d4fda40f147627a122849a4",
    "python_dateutil-2.9.0.post0-py2.py3-none-any.whl": (
        "a8b2bc7bffae282281c8140a97d3aa9c14da0b136dfe83f850eea9a5f7470427"
    ),
    "pytz-2026.6-py2.py3-none-any.whl": "7fed3fee8fd6bd4a2b7b75a8d56021d0624127bf69bd5691f115db929ac570b3",
    "pyzmq-27.3.0-cp311-cp311-manylinux_2_26_x86_64.manylinux_2_28_x86_64.whl": (
        "477b8ad30d66fc905c5388351e83b9ac25824b00e82c0d052b72ea6392636dfd"
    ),
    "requests-2.31.0-py3-none-any.whl": "58cd2187c01e70e6e26505bca751777aa9f2ee0b7f4300988b709f44e013003f",
    "ruamel_yaml-0.19.1-py3-none-any.whl": "27592957fedf6e0b62f281e96effd28043345e0e66001f97683aa9a40c667c93",
    "s3transfer-0.10.4-py3-none-any.whl": "244a76a24355363a68164241438de1b72f8781664920260c48465896b712a41e",
    "six-1.16.0-py2.py3-none-any.whl": "8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254",
    "smmap-5.0.3-py3-none-any.whl": "c106e05d5a61449cf6ba9a1e650227ecfb141590d2a98412103ff35d89fc7b2f",
    "tabulate-0.10.0-py3-none-any.whl": "f0b0622e567335c8fabaaa659f1b33bcb6ddfe2e496071b743aa113f8774f2d3",
    "termcolor-3.3.0-py3-none-any.whl": "cf642efadaf0a8ebbbf4bc7a31cec2f9b5f21a9f726f4ccbb08192c9c26f43a5",
    "tqdm-4.70.1-py3-none-any.whl": "c293e525e6fef9c20e8728fd4612df02a0aa31bb5fe91ecd93e123b1b7bffa73",
    "typing_extensions-4.16.0-py3-none-any.whl": (
        "481caa481374e813c1b176ada14e97f1f67a4539ce9cfeb3f350d78d6370c2e8"
    ),
    "uritemplate-4.2.0-py3-none-any.whl": "962201ba1c4edcab02e60f9a0d3821e82dfc5d2d6662a21abd533879bdb8a686",
    "urllib3-2.2.3-py3-none-any.whl": "ca899ca043dcb1bafa3e262d73aa25c465bfb49e0bd9dd5d59f1d0acba2f8fac",
}
