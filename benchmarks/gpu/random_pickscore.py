"""The PickScore reward's architecture with seeded random weights, for benchmarks/gpu/loop.sh at real size:
the cost of the real reward without its checkpoints (none can be downloaded on the benchmark machines).

    python benchmarks/gpu/random_pickscore.py DIR

writes DIR/pickscore (transformers CLIPModel at CLIP ViT-H/14's configuration, the PickScore_v1 architecture:
vision 32 layers x 1280, patch 14, 224 px; text 24 layers x 1024; projection 1024), DIR/vae (diffusers
AutoencoderKL at SD3.5's VAE configuration: 16 latent channels, scaling 1.5305, shift 0.0609) and
DIR/processor (CLIPProcessor: CLIP's image preprocessing at 224 px, a word-level tokenizer of the prompt
characters, since CLIP's BPE vocabulary is a download too; the text tower runs once, at export).
tools/export_reward.py --vae DIR/vae --pickscore DIR/pickscore --processor DIR/processor then traces them.
"""
import os
import string
import sys

import torch


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, "<s>": 2, "</s>": 3}
    for ch in string.printable:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 2), ("</s>", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", model_max_length=77)


def main(out):
    import diffusers
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    torch.manual_seed(0)
    config = CLIPConfig(
        text_config={"vocab_size": 128, "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                     "num_attention_heads": 16, "max_position_embeddings": 77, "hidden_act": "gelu",
                     "bos_token_id": 2, "eos_token_id": 3, "pad_token_id": 0},
        vision_config={"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32,
                       "num_attention_heads": 16, "patch_size": 14, "image_size": 224, "hidden_act": "gelu"},
        projection_dim=1024)
    CLIPModel(config).save_pretrained(os.path.join(out, "pickscore"))
    CLIPProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 224}, crop_size=224),
                  tokenizer=tokenizer()).save_pretrained(os.path.join(out, "processor"))
    vae = diffusers.AutoencoderKL(in_channels=3, out_channels=3, latent_channels=16,
                                  down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
                                  block_out_channels=[128, 256, 512, 512], layers_per_block=2, sample_size=1024,
                                  scaling_factor=1.5305, shift_factor=0.0609, use_quant_conv=False,
                                  use_post_quant_conv=False)
    vae.save_pretrained(os.path.join(out, "vae"))
    print(f"random PickScore (CLIP ViT-H/14) and SD3 VAE written to {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
