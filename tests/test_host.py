import platform

from megatron_gamma.host import cpu_model


def test_cpu_model_is_the_first_model_name_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7763 64-Core Processor\n"
        "\nprocessor\t: 1\nmodel name\t: a second name\n",
        encoding="utf-8",
    )
    assert cpu_model(str(info)) == "AMD EPYC 7763 64-Core Processor"


def test_cpu_model_falls_back_where_cpuinfo_names_none(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nCPU implementer\t: 0x41\n", encoding="utf-8")
    expected = platform.processor() or platform.machine() or "unknown CPU"
    assert cpu_model(str(info)) == expected
    assert cpu_model(str(tmp_path / "absent")) == expected
