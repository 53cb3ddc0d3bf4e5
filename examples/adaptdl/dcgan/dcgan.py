"""DCGAN: AdaptDL's example (examples/dcgan/dcgan.py in petuum/adaptdl) on Pollux.

Two models, a generator and a discriminator, trained from one data loader: each is an
``AdaptiveDataParallel`` with its own ``name``. Written in the example's shape; what
differs are the import lines (marked "Pollux"), the data (synthetic 64x64 colour images
of blurred blobs, made here, in place of CelebA), the command-line flags for its
constants (defaults: AdaptDL's), and ``name=`` passed by keyword (AdaptDL's example
passes it 4th, where AdaptDL 0.2.11 expects the mixed-precision scaler; Pollux accepts
both).

    python examples/adaptdl/dcgan/dcgan.py --epochs 2 --num-samples 256 --ngf 8 --ndf 8
    pollux submit --max-replicas 2 -- python examples/adaptdl/dcgan/dcgan.py
"""
from __future__ import print_function
import argparse
import os
import random
import torch
import torch.nn as nn
import torch.nn.parallel
import torch.optim as optim
import torch.utils.data
from pollux import adaptdl  # Pollux: was `import adaptdl`
import pollux.adaptdl.torch as adl  # Pollux: was `import adaptdl.torch as adl`
import pollux.adaptdl.torch._metrics as metrics  # Pollux: was `import adaptdl.torch._metrics as metrics`
from torch.utils.tensorboard import SummaryWriter

parser = argparse.ArgumentParser(description="DCGAN")
parser.add_argument("--seed", type=int, default=None, help="default: a random one")
parser.add_argument("--batch-size", type=int, default=128)
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--ngf", type=int, default=64, help="generator feature maps")
parser.add_argument("--ndf", type=int, default=64, help="discriminator feature maps")
parser.add_argument("--num-samples", type=int, default=2048, help="synthetic images")
args = parser.parse_args()

# Set random seed for reproducibility
manualSeed = args.seed if args.seed is not None else random.randint(1, 10000)
print("Random Seed: ", manualSeed)
random.seed(manualSeed)
torch.manual_seed(manualSeed)

workers = 2
batch_size = args.batch_size
image_size = 64
nc = 3  # Number of channels in the training images
nz = 100  # Size of z latent vector (i.e. size of generator input)
ngf = args.ngf
ndf = args.ndf
num_epochs = args.epochs
lr = 0.0005
ngpu = 1

dataroot = adaptdl.env.share_path()


def synthetic_faces(root, count):
    """In place of CelebA: ``count`` 64x64 colour images of a blurred blob at a random
    place on a gradient background, in [-1, 1] like the normalized CelebA images."""
    gen = torch.Generator().manual_seed(0)
    ys, xs = torch.meshgrid(torch.linspace(-1, 1, image_size),
                            torch.linspace(-1, 1, image_size), indexing="ij")
    centres = torch.rand(count, 2, generator=gen) - 0.5
    colours = torch.rand(count, 3, 1, 1, generator=gen) * 2 - 1
    dist2 = (xs - centres[:, :1, None]) ** 2 + (ys - centres[:, 1:, None]) ** 2
    blob = torch.exp(-dist2 / 0.1).unsqueeze(1)
    images = (blob * colours + (1 - blob) * ys * 0.5).clamp(-1, 1)
    return torch.utils.data.TensorDataset(images, torch.zeros(count))


dataset = synthetic_faces(dataroot, args.num_samples)
dataloader = adl.AdaptiveDataLoader(dataset, batch_size=batch_size,
                                    num_workers=workers, shuffle=False)
dataloader.autoscale_batch_size(8 * batch_size, local_bsz_bounds=(8, 1024))

device = torch.device("cuda:0" if (torch.cuda.is_available() and ngpu > 0) else "cpu")


# custom weights initialization called on netG and netD
def weights_init(m):
    classname = m.__class__.__name__
    if classname.find('Conv') != -1:
        nn.init.normal_(m.weight.data, 0.0, 0.02)
    elif classname.find('BatchNorm') != -1:
        nn.init.normal_(m.weight.data, 1.0, 0.02)
        nn.init.constant_(m.bias.data, 0)


class Generator(nn.Module):
    def __init__(self, ngpu):
        super(Generator, self).__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 8, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 8),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 8, ngf * 4, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf * 4),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),
            nn.Tanh()
        )

    def forward(self, input):
        return self.main(input)


netG = Generator(ngpu).to(device)
netG.apply(weights_init)


class Discriminator(nn.Module):
    def __init__(self, ngpu):
        super(Discriminator, self).__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 4),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 4, ndf * 8, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 8),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 8, 1, 4, 1, 0, bias=False),
            nn.Sigmoid()
        )

    def forward(self, input):
        return self.main(input)


netD = Discriminator(ngpu).to(device)
netD.apply(weights_init)

criterion = nn.BCELoss()
real_label = 1.
fake_label = 0.

optimizerD = optim.SGD(netD.parameters(), lr=lr, momentum=0.9, nesterov=True)
optimizerG = optim.SGD(netG.parameters(), lr=lr, momentum=0.9, nesterov=True)
scheduleD = optim.lr_scheduler.StepLR(optimizerD, 15, 0.1)
scheduleG = optim.lr_scheduler.StepLR(optimizerG, 15, 0.1)

adaptdl.torch.init_process_group("nccl" if torch.cuda.is_available()
                                 else "gloo")
netD = adl.AdaptiveDataParallel(netD, optimizerD, scheduleD, name="netD")
netG = adl.AdaptiveDataParallel(netG, optimizerG, scheduleG, name="netG")

G_losses = []
D_losses = []
tensorboard_dir = os.path.join(os.getenv("ADAPTDL_TENSORBOARD_LOGDIR", "/tmp"),
                               adaptdl.env.job_id())


def train(epoch):
    stats = adl.Accumulator()
    for i, data in enumerate(dataloader, 0):
        # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
        data = data[0]
        netD.zero_grad()
        real_cpu = data.to(device)
        b_size = real_cpu.size(0)
        label = torch.full((b_size,), real_label, device=device)
        output = netD(real_cpu).view(-1)
        errD_real = criterion(output, label)
        errD_real.backward()
        noise = torch.randn(b_size, nz, 1, 1, device=device)
        fake = netG(noise)
        label.fill_(fake_label)
        output = netD(fake.detach()).view(-1)
        errD_fake = criterion(output, label)
        errD_fake.backward()
        errD = errD_real + errD_fake
        optimizerD.step()
        # (2) Update G network: maximize log(D(G(z)))
        netG.zero_grad()
        label.fill_(real_label)  # fake labels are real for generator cost
        output = netD(fake).view(-1)
        errG = criterion(output, label)
        errG.backward()
        optimizerG.step()
        G_losses.append(errG.item())
        D_losses.append(errD.item())
        stats["g_loss_sum"] += errG.item()
        stats["d_loss_sum"] += errD.item()
        stats["batches"] += 1
    stats["norm"] += metrics._metrics_state().grad_params[0]
    stats["var"] += metrics._metrics_state().grad_params[1]
    stats["replicas"] += 1.0
    scheduleD.step()
    scheduleG.step()
    with stats.synchronized():
        with SummaryWriter(tensorboard_dir) as writer:
            writer.add_scalar("Loss/G", stats["g_loss_sum"] / stats["batches"], epoch)
            writer.add_scalar("Loss/D", stats["d_loss_sum"] / stats["batches"], epoch)
            writer.add_scalar("Performance/GlobalBatchsize", b_size * stats["replicas"], epoch)
            writer.add_scalar("Performance/Replicas", stats["replicas"], epoch)
            writer.add_scalar("Stats/Variance", stats["var"] / stats["replicas"], epoch)
            writer.add_scalar("Stats/Norm", stats["norm"] / stats["replicas"], epoch)
        print("Epoch {}: Loss_D {:.4f} Loss_G {:.4f} batch size {}".format(
            epoch, stats["d_loss_sum"] / stats["batches"],
            stats["g_loss_sum"] / stats["batches"], dataloader.current_batch_size))


for epoch in adl.remaining_epochs_until(num_epochs):
    train(epoch)
