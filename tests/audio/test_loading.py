"""Loading recordings through fastload.DataLoader(audio=fastload.Audio(...)): the samples each
crop's plan names (describe), decoded from a seek before them, mixed down and resampled; a pure
function of (seed, epoch, index): worker counts, exact and elastic resume, equal batches across
ranks; short recordings padded or dropped; several crops; a video's sound track; log-mel."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload
from fastload import Audio
from fastload.converters import ConvertOptions, convert
from tests.audio.conftest import PLAN
from tests.test_resume_contract import run_resume_contract


def reference(truth: np.ndarray, rate: int, start_s: float, target_rate: int, count: int, channels: int = 1) -> np.ndarray:
    """The crop from ``start_s`` of ``truth`` (channels, n at ``rate``), mixed to mono where asked,
    at ``target_rate`` by linear interpolation (exact enough for a tone under 2 kHz)."""
    mixed = truth.mean(axis=0, keepdims=True) if channels == 1 else truth
    times = start_s + np.arange(count) / target_rate
    return np.stack([np.interp(times * rate, np.arange(mixed.shape[1]), row) for row in mixed]).astype(np.float32)


def rate_of(key: str) -> tuple[str, int]:
    ext, _, rate, _ = PLAN[int(key.split("/r")[1])]
    return ext, {"opus": 48000}.get(ext, rate)


@pytest.mark.parametrize("target_rate", [16000, 8000])
def test_crops_hold_the_samples_describe_names_mixed_and_resampled(audio_dataset: Path, recordings, target_rate: int) -> None:
    _, truth = recordings
    audio = Audio(seconds=0.5, rate=target_rate)
    loader = fastload.DataLoader(audio_dataset, batch_size=4, shuffle=True, seed=3, num_workers=2, return_keys=True, audio=audio)
    seen = 0
    for step, (samples, lengths, _, keys) in enumerate(loader):
        assert samples.shape == (4, 1, audio.length) and samples.dtype == torch.float32 and lengths.tolist() == [audio.length] * 4
        for row, sample in enumerate(loader.describe(step, 0).samples):
            assert sample.key == keys[row] and len(sample.crops) == 1
            ext, rate = rate_of(sample.key)
            start, end = sample.crops[0]
            assert end - start == pytest.approx(0.5, abs=1 / rate) and start >= 0 and end <= truth[sample.key].shape[1] / rate + 1e-6
            want = reference(truth[sample.key], rate, round(start * rate) / rate, target_rate, audio.length)  # a crop starts at a sample
            got = samples[row].numpy()
            edge = 64  # the resampler's filter sees zeros past a crop's ends
            error = np.abs(got[:, edge:-edge] - want[:, edge:-edge]).max()
            if ext in ("flac", "wav") and rate == target_rate:
                assert error < 2e-4, (sample.key, error)  # the very samples (16-bit quantised)
            else:
                assert error < (0.02 if ext in ("flac", "wav") else 0.08), (sample.key, error)  # resampled / lossy, but aligned
                assert np.corrcoef(got[0, edge:-edge], want[0, edge:-edge])[0, 1] > 0.97, sample.key
            seen += 1
    assert seen == len(PLAN)


def test_stereo_keeps_its_channels_and_mono_is_their_mean(audio_dataset: Path, recordings) -> None:
    _, truth = recordings
    stereo = fastload.DataLoader(audio_dataset, batch_size=8, audio=Audio(seconds=0.4, channels=2, rate=16000), return_keys=True)
    mono = fastload.DataLoader(audio_dataset, batch_size=8, audio=Audio(seconds=0.4, channels=1, rate=16000), return_keys=True)
    (two, _, _, keys), (one, _, _, _) = next(iter(stereo)), next(iter(mono))
    assert two.shape == (8, 2, 6400) and one.shape == (8, 1, 6400)
    for row, key in enumerate(keys):
        if truth[key].shape[0] == 2:
            assert not torch.allclose(two[row, 0], two[row, 1])  # the fixture's channels differ in loudness
            if rate_of(key)[1] == 16000:
                assert torch.allclose(one[row, 0], two[row].mean(0), atol=1e-6)
        else:
            assert torch.equal(two[row, 0], two[row, 1])  # mono to stereo: the one channel twice


def test_crops_are_a_pure_function_of_seed_epoch_and_index(audio_dataset: Path) -> None:
    def run(workers: int) -> list[torch.Tensor]:
        loader = fastload.DataLoader(audio_dataset, batch_size=3, shuffle=True, seed=7, num_workers=workers,
                                     audio=Audio(seconds=0.3, rate=12000, crops=2))
        loader.set_epoch(2)
        return [batch[0] for batch in loader]

    inline, pooled = run(0), run(2)
    assert len(inline) == 3 and all(torch.equal(a, b) for a, b in zip(inline, pooled))


def test_a_random_crop_changes_from_epoch_to_epoch(audio_dataset: Path) -> None:
    loader = fastload.DataLoader(audio_dataset, batch_size=4, shuffle=True, seed=1, audio=Audio(seconds=0.25))
    starts: dict[str, set[float]] = {}
    for epoch in range(4):
        for step in range(len(loader)):
            for sample in loader.describe(step, epoch).samples:
                starts.setdefault(sample.key, set()).add(sample.crops[0][0])
    assert len(starts) == len(PLAN) and all(len(s) > 1 for s in starts.values())


@pytest.mark.parametrize("taken", [0, 1])
def test_resume_mid_epoch_equals_an_uninterrupted_run(audio_dataset: Path, taken: int) -> None:
    """The harness compares (samples, lengths, keys) batches: fields=["audio"] gives the first two."""
    run_resume_contract(lambda: fastload.DataLoader(audio_dataset, batch_size=4, shuffle=True, seed=5, num_workers=1, return_keys=True,
                                                    fields=["audio"], audio=Audio(seconds=0.3, rate=8000)), taken)


def test_elastic_resume_delivers_every_remaining_recording_once_with_equal_batches_per_rank(audio_dataset: Path) -> None:
    options = dict(batch_size=1, shuffle=True, seed=2, return_keys=True, audio=Audio(seconds=0.2, rate=8000))
    whole = [k for *_, keys in fastload.DataLoader(audio_dataset, **options) for k in keys]
    first = [fastload.DataLoader(audio_dataset, rank=r, world_size=2, **options) for r in range(2)]
    assert len(first[0]) == len(first[1]) == 4  # equal batches on every rank
    before = [k for loader in first for k in next(iter(loader))[-1]]
    state = first[0].state_dict()
    resumed = fastload.DataLoader(audio_dataset, world_size=3, rank=0, **options)
    resumed.load_state_dict(state)
    others = [fastload.DataLoader(audio_dataset, world_size=3, rank=r, **options) for r in (1, 2)]
    for other in others:
        other.load_state_dict(state)
    after = [[k for *_, keys in loader for k in keys] for loader in (resumed, *others)]
    assert len({len(keys) for keys in after}) == 1  # equal batches on every rank of the new world
    assert set(Counter(before) + Counter(k for keys in after for k in keys)) == set(whole)
    assert Counter(before) + Counter(k for keys in after for k in keys) - Counter(whole) <= Counter(k for keys in after for k in keys)


def test_several_uniform_crops_for_evaluation(audio_dataset: Path) -> None:
    loader = fastload.DataLoader(audio_dataset, batch_size=8, audio=Audio(seconds=0.5, crops=3, rate=8000))
    samples, lengths, _ = next(iter(loader))
    assert samples.shape == (8, 3, 1, 4000) and lengths.shape == (8, 3) and loader.options.audio.sampling == "uniform"
    ds = fastload.open(audio_dataset)
    for sample in loader.describe(0, 0).samples:
        facts = next(iter(ds.stream_facts(sample.index).values()))
        last = (facts.samples - round(0.5 * facts.rate)) / facts.rate
        assert [round(c[0], 4) for c in sample.crops] == [0.0, round(round(last * facts.rate / 2) / facts.rate, 4), round(last, 4)]


def test_a_recording_shorter_than_a_crop_is_padded_with_its_length_or_dropped_by_name(audio_dataset: Path, recordings) -> None:
    _, truth = recordings
    padded = fastload.DataLoader(audio_dataset, batch_size=8, audio=Audio(seconds=2.2, rate=8000, sampling="start"), return_keys=True)
    samples, lengths, _, keys = next(iter(padded))
    ds = fastload.open(audio_dataset)
    for row, (key, sample) in enumerate(zip(keys, padded.describe(0, 0).samples)):
        assert sample.key == key
        facts = next(iter(ds.stream_facts(sample.index).values()))
        if facts.seconds < 2.2:  # its every sample (as decoded: a lossy codec's padding included), then zeros
            assert lengths[row] == round(facts.samples * 8000 / facts.rate) and not samples[row, :, lengths[row]:].any()
            assert sample.crops == ((0.0, round(facts.seconds, 6)),)
            assert samples[row, :, : lengths[row]].abs().max() > 0.1
        else:
            assert lengths[row] == 17600
    with pytest.raises(ValueError, match="short='drop'.* needs on_error='skip'"):
        fastload.DataLoader(audio_dataset, batch_size=2, audio=Audio(seconds=2.2, short="drop"))
    dropped = fastload.DataLoader(audio_dataset, batch_size=1, audio=Audio(seconds=2.2, short="drop", rate=8000), on_error="skip",
                                  return_keys=True, max_skipped=None)
    kept = [k for *_, keys in dropped for k in keys]
    long = {k for k in truth if truth[k].shape[1] / rate_of(k)[1] >= 2.2}
    assert set(kept) == long
    reasons = {entry["reason"] for entry in dropped.stats.skipped.entries}
    assert reasons and all("shorter than a crop of 2.2 s (Audio short='drop')" in reason for reason in reasons)


def test_audio_and_audio_fields_are_asked_for_together(audio_dataset: Path, clean: Path) -> None:
    with pytest.raises(ValueError, match="field flac is audio: give audio=fastload.Audio"):
        fastload.DataLoader(audio_dataset, batch_size=2, fields=["flac"])
    with pytest.raises(ValueError, match="audio= takes crops of recordings; the fields asked for hold none"):
        fastload.DataLoader(clean, batch_size=2, fields=["cls"], audio=Audio())
    with pytest.raises(ValueError, match="Audio channels must be a whole number from 1 to 64, got 0"):
        Audio(channels=0)
    with pytest.raises(ValueError, match="Audio mel= needs crops of more than 200 samples"):
        Audio(seconds=0.01, mel=80)
    with pytest.raises(ValueError, match="Audio sampling='centred' takes one crop a recording"):
        Audio(crops=2, sampling="centred")
    fields = fastload.DataLoader(audio_dataset, batch_size=2, fields=["audio", "cls"], audio=Audio(seconds=0.1))
    samples, lengths, labels = next(iter(fields))
    assert samples.shape == (2, 1, 1600) and lengths.shape == (2,) and labels.shape == (2,)


def test_the_sound_track_of_a_video_loads_and_a_video_without_one_is_a_bad_sample_by_name(tmp_path: Path) -> None:
    from tests.video.media import camera_frames, encode

    (tmp_path / "raw" / "a").mkdir(parents=True)
    frames = camera_frames(1, 48, 64, 48)
    (tmp_path / "raw" / "a" / "with.mp4").write_bytes(encode(frames, audio_rate=16000))  # 2 s of a 440 Hz tone
    (tmp_path / "raw" / "a" / "without.mp4").write_bytes(encode(frames))
    convert(str(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(source="videos"), quiet=True)
    options = dict(batch_size=1, fields={"mp4": "audio"}, audio=Audio(seconds=1.0, rate=8000, sampling="centred"), return_keys=True)
    with pytest.raises(fastload.SampleError, match="shard-00000.tar:a/without: field mp4: a video with no audio stream, and its audio was asked for"):
        list(fastload.DataLoader(tmp_path / "out", **options))
    loader = fastload.DataLoader(tmp_path / "out", on_error="skip", **options)
    batches = list(loader)  # the one with sound stands in for the one without: every batch keeps its size
    assert [keys for _, _, keys in batches] == [["a/with"]] * 2
    sound, lengths, _ = batches[0]
    assert sound.shape == (1, 1, 8000) and lengths.tolist() == [8000]
    assert [entry["reason"] for entry in loader.stats.skipped.entries] == ["field mp4: a video with no audio stream, and its audio was asked for"]
    spectrum = np.abs(np.fft.rfft(sound[0, 0].numpy()))
    assert abs(np.argmax(spectrum) - 440) <= 1 and sound.abs().max() > 0.1  # bins of 1 Hz: the tone, heard
    from fastload import Clip
    from fastload import transforms as T

    both = fastload.DataLoader(tmp_path / "out", batch_size=1, fields={"mp4": "video", "video": "audio"}, clip=Clip(frames=4),
                               audio=Audio(seconds=0.5, rate=8000), transform=[T.Resize((48, 64))], on_error="skip")
    clips, sound, lengths = next(iter(both))  # the frames and the sound of one file, as two fields
    described = both.describe(0, 0).samples[0]
    assert clips.shape == (1, 4, 3, 48, 64) and sound.shape == (1, 1, 4000) and described.video == described.audio == "mp4"
    assert len(described.clips) == len(described.crops) == 1


def whisper_log_mel(audio: np.ndarray, n_mels: int) -> np.ndarray:
    """openai-whisper's ``log_mel_spectrogram`` (whisper/audio.py), line by line, with the filters of
    ``librosa.filters.mel(sr=16000, n_fft=400, n_mels=n_mels)`` (what its mel_filters.npz holds)
    written out as librosa computes them."""
    sr, n_fft, hop = 16000, 400, 160
    # librosa.filters.mel: fft_frequencies, mel_frequencies (Slaney), triangular weights, slaney norm
    fftfreqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sr)
    f_sp = 200.0 / 3
    min_log_hz, logstep = 1000.0, np.log(6.4) / 27.0
    min_log_mel = min_log_hz / f_sp

    def hz_to_mel(f: float) -> float:
        return f / f_sp if f < min_log_hz else min_log_mel + np.log(f / min_log_hz) / logstep

    mels = np.linspace(hz_to_mel(0.0), hz_to_mel(sr / 2), n_mels + 2)
    mel_f = np.where(mels >= min_log_mel, min_log_hz * np.exp(logstep * (mels - min_log_mel)), f_sp * mels)
    fdiff = np.diff(mel_f)
    ramps = np.subtract.outer(mel_f, fftfreqs)
    weights = np.zeros((n_mels, len(fftfreqs)))
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels]))[:, np.newaxis]
    filters = torch.from_numpy(weights.astype(np.float32))
    # whisper.audio.log_mel_spectrogram
    window = torch.hann_window(n_fft)
    stft = torch.stft(torch.from_numpy(audio), n_fft, hop, window=window, return_complex=True)
    magnitudes = stft[..., :-1].abs() ** 2
    mel_spec = filters @ magnitudes
    log_spec = torch.clamp(mel_spec, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).numpy()


@pytest.mark.parametrize("bins", [80, 128])
def test_log_mel_features_equal_whispers_recipe_and_transformers_extractor(audio_dataset: Path, bins: int) -> None:
    audio = Audio(seconds=1.0, rate=16000, mel=bins, sampling="start", short="pad")
    features = fastload.DataLoader(audio_dataset, batch_size=8, audio=audio)
    waves = fastload.DataLoader(audio_dataset, batch_size=8, audio=Audio(seconds=1.0, rate=16000, sampling="start"))
    (mel, lengths, _), (samples, _, _) = next(iter(features)), next(iter(waves))
    assert mel.shape == (8, 1, bins, 100) and mel.dtype == torch.float32 and lengths.tolist() == [16000] * 8
    from transformers import WhisperFeatureExtractor  # Hugging Face's own front end for Whisper, built from its defaults

    extractor = WhisperFeatureExtractor(feature_size=bins)
    for row in range(8):
        want = whisper_log_mel(samples[row, 0].numpy(), bins)
        theirs = extractor(samples[row, 0].numpy(), sampling_rate=16000, padding="longest", return_tensors="np").input_features[0]
        assert want.shape == theirs.shape == (bins, 100)
        assert np.abs(mel[row, 0].numpy() - want).max() < 1e-4, row
        assert np.abs(mel[row, 0].numpy() - theirs).max() < 1e-4, row


def test_surround_recordings_mix_down_remix_or_keep_their_channels(tmp_path: Path) -> None:
    from tests.audio.media import chirp, encode

    (tmp_path / "raw" / "a").mkdir(parents=True)
    six = chirp(16000, 1.0, 6)  # 5.1, each channel louder than the one before
    (tmp_path / "raw" / "a" / "surround.flac").write_bytes(encode(six, 16000, "flac"))
    convert(str(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(source="audio"), quiet=True)

    def load(channels: int) -> torch.Tensor:
        loader = fastload.DataLoader(tmp_path / "out", batch_size=1, audio=Audio(seconds=0.5, channels=channels, sampling="start"))
        return next(iter(loader))[0][0]

    kept, mono, stereo = load(6), load(1), load(2)
    assert kept.shape == (6, 8000) and np.abs(kept.numpy() - six[:, :8000]).max() < 2e-4  # the stored samples
    assert torch.allclose(mono[0], kept.mean(0), atol=1e-6)
    assert stereo.shape == (2, 8000) and not torch.allclose(stereo[0], stereo[1]) and stereo.abs().max() > 0.1  # swr's 5.1 downmix


def test_a_mixture_of_audio_datasets_loads_and_describes_its_crops(audio_dataset: Path, tmp_path: Path) -> None:
    import shutil

    shutil.copytree(audio_dataset, tmp_path / "other")
    mixed = fastload.mix({str(audio_dataset): 0.5, str(tmp_path / "other"): 0.5})
    loader = fastload.DataLoader(mixed, batch_size=4, shuffle=True, seed=4, num_workers=1, return_keys=True, audio=Audio(seconds=0.25))
    members = set()
    for step, (samples, lengths, _, keys) in enumerate(loader):
        described = loader.describe(step, 0).samples
        assert samples.shape == (4, 1, 4000) and lengths.tolist() == [4000] * 4 and [s.key for s in described] == keys
        assert all(len(s.crops) == 1 and s.crops[0][1] - s.crops[0][0] == pytest.approx(0.25, abs=1e-4) for s in described)
        members |= {key.split("/")[0] for key in keys}
    assert members == {"0", "1"}


def test_stats_time_reading_decoding_and_resampling(audio_dataset: Path) -> None:
    from fastload.workers.stage_clock import READ_BYTES

    loader = fastload.DataLoader(audio_dataset, batch_size=4, num_workers=2, audio=Audio(seconds=0.5, rate=8000))
    for _ in loader:
        pass
    epoch = loader.stats.epochs[-1]
    stages = epoch.stage_s()
    ds = fastload.open(audio_dataset)
    stored = sum(len(value) for i in range(len(ds)) for value in ds.raw(i)[1].values())
    assert epoch.samples == len(PLAN) and epoch.workers is not None and epoch.workers[:, READ_BYTES].sum() == stored
    assert stages["decode"] > 0 and stages["transform"] > 0 and stages["read"] > 0
    loader.close()


@pytest.mark.parametrize("encoder, step", [("pcm_u8", 1 / 128), ("pcm_s24le", 1 / 2**23), ("pcm_s32le", 1 / 2**31), ("pcm_f32le", 0.0),
                                           ("pcm_f64le", 0.0)])
def test_every_pcm_sample_format_becomes_float32_in_minus_one_to_one(tmp_path: Path, encoder: str, step: float) -> None:
    """8-bit unsigned (its zero at 128), 24-, 32-bit and float samples, packed as WAV stores them."""
    from tests.audio.media import chirp, encode

    (tmp_path / "raw" / "a").mkdir(parents=True)
    samples = chirp(16000, 1.0, 2)
    (tmp_path / "raw" / "a" / "x.wav").write_bytes(encode(samples, 16000, "wav", encoder))
    convert(str(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(source="audio"), quiet=True)
    loader = fastload.DataLoader(tmp_path / "out", batch_size=1, audio=Audio(seconds=0.5, channels=2, sampling="centred"))
    crop, _, _ = next(iter(loader))
    start = round(loader.describe(0, 0).samples[0].crops[0][0] * 16000)
    assert np.abs(crop[0].numpy() - samples[:, start : start + 8000]).max() <= step + 1e-7


def torchaudio_resample(waveform: torch.Tensor, orig_freq: int, new_freq: int) -> torch.Tensor:
    """torchaudio.functional.resample(waveform, orig_freq, new_freq) with its defaults (sinc_interp_hann,
    lowpass_filter_width=6, rolloff=0.99), line by line from torchaudio/functional/functional.py."""
    import math

    gcd = math.gcd(orig_freq, new_freq)
    orig_freq, new_freq = orig_freq // gcd, new_freq // gcd
    base_freq = min(orig_freq, new_freq) * 0.99
    width = math.ceil(6 * orig_freq / base_freq)
    idx = torch.arange(-width, width + orig_freq, dtype=torch.float64)[None, None] / orig_freq
    t = torch.arange(0, -new_freq, -1, dtype=torch.float64)[:, None, None] / new_freq + idx
    t *= base_freq
    t = t.clamp_(-6, 6)
    window = torch.cos(t * math.pi / 6 / 2) ** 2
    t *= math.pi
    kernels = torch.where(t == 0, torch.tensor(1.0).to(t), t.sin() / t) * window * (base_freq / orig_freq)
    length = waveform.shape[-1]
    padded = torch.nn.functional.pad(waveform.to(torch.float64), (width, width + orig_freq))
    resampled = torch.nn.functional.conv1d(padded[:, None], kernels, stride=orig_freq).transpose(1, 2).reshape(waveform.shape[0], -1)
    return resampled[..., : math.ceil(new_freq * length / orig_freq)]


@pytest.mark.parametrize("rate", [22050, 44100, 48000, 11025, 8000, 96000, 32000])
def test_a_crop_is_resampled_as_torchaudio_resamples_it(tmp_path: Path, rate: int) -> None:
    from tests.audio.media import chirp, encode

    (tmp_path / "raw" / "a").mkdir(parents=True)
    data = encode(chirp(rate, 1.5, 1), rate, "flac")
    (tmp_path / "raw" / "a" / "x.flac").write_bytes(data)
    convert(str(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(source="audio"), quiet=True)
    loader = fastload.DataLoader(tmp_path / "out", batch_size=1, shuffle=True, audio=Audio(seconds=1.0, rate=16000))
    crop, lengths, _ = next(iter(loader))
    start = round(loader.describe(0, 0).samples[0].crops[0][0] * rate)
    from fastload.av.pyav import decode_crops

    stored = torch.from_numpy(next(decode_crops(data, "x", fastload.open(tmp_path / "out").stream_facts(0)["flac"], [(start, rate)], float("inf"))))
    want = torchaudio_resample(stored, rate, 16000)[:, :16000].float()
    assert lengths.tolist() == [16000] and torch.allclose(crop[0], want, atol=1e-5)


def test_rates_sharing_no_large_divisor_are_resampled_by_swr(tmp_path: Path) -> None:
    from tests.audio.media import chirp, encode

    (tmp_path / "raw" / "a").mkdir(parents=True)
    samples = chirp(16001, 1.5, 1)  # 16001 and 16000: a 16000 x 32001 kernel, over the cap
    (tmp_path / "raw" / "a" / "x.wav").write_bytes(encode(samples, 16001, "wav"))
    convert(str(tmp_path / "raw"), str(tmp_path / "out"), ConvertOptions(source="audio"), quiet=True)
    loader = fastload.DataLoader(tmp_path / "out", batch_size=1, audio=Audio(seconds=1.0, rate=16000, sampling="centred"))
    crop, lengths, _ = next(iter(loader))
    start_s = round(loader.describe(0, 0).samples[0].crops[0][0] * 16001) / 16001
    want = reference(samples, 16001, start_s, 16000, 16000)
    assert lengths.tolist() == [16000] and np.abs(crop[0].numpy()[:, 64:-64] - want[:, 64:-64]).max() < 0.01


def test_several_crops_of_a_recording_decoded_from_one_open_container_each_hold_their_samples(audio_dataset: Path, recordings) -> None:
    """Three random crops of each recording (one container opened, sought three times, its decoder
    flushed between) each equal the recording's samples where describe places them."""
    _, truth = recordings
    loader = fastload.DataLoader(audio_dataset, batch_size=len(PLAN), shuffle=True, seed=11, return_keys=True,
                                 audio=Audio(seconds=0.4, crops=3, rate=16000))
    samples, lengths, _, keys = next(iter(loader))
    assert lengths.tolist() == [[6400] * 3] * len(PLAN)
    for row, sample in enumerate(loader.describe(0, 0).samples):
        assert sample.key == keys[row]
        ext, rate = rate_of(sample.key)
        for crop, (start, _) in enumerate(sample.crops):
            want = reference(truth[sample.key], rate, round(start * rate) / rate, 16000, 6400)
            got = samples[row, crop].numpy()
            error = np.abs(got[:, 64:-64] - want[:, 64:-64]).max()
            assert error < (2e-4 if ext in ("flac", "wav") and rate == 16000 else 0.02 if ext in ("flac", "wav") else 0.08), (sample.key, crop, error)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_int16_batches_are_the_float_crops_times_32767_rounded_and_clipped(audio_dataset: Path, num_workers: int) -> None:
    """Audio(dtype="int16"): (B, crops, C, T) int16 batches holding each float32 crop (every codec,
    resampled and not, a padded one) times 32767, rounded and clipped, the same lengths; mel refuses it."""
    batches = {}
    for dtype in ("float32", "int16"):
        loader = fastload.DataLoader(audio_dataset, batch_size=len(PLAN), num_workers=num_workers, shuffle=True, seed=3,
                                     audio=Audio(seconds=1.8, crops=2, rate=16000, channels=2, dtype=dtype))
        batches[dtype] = next(iter(loader))
    (floats, float_lengths, _), (ints, int_lengths, _) = batches["float32"], batches["int16"]
    assert ints.dtype == torch.int16 and ints.shape == floats.shape == (len(PLAN), 2, 2, 28800)
    assert torch.equal(int_lengths, float_lengths) and (int_lengths < 28800).any()  # a recording shorter than a crop: padded
    want = torch.clamp(torch.round(floats * 32767), -32768, 32767).to(torch.int16)
    assert torch.equal(ints, want) and ints.abs().max() > 8000
    with pytest.raises(ValueError, match="mel= gives log-mel features, which are float32"):
        Audio(seconds=1.0, mel=80, dtype="int16")
    with pytest.raises(ValueError, match="Audio dtype must be one of"):
        Audio(dtype="int8")  # type: ignore[arg-type]
