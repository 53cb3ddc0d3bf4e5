"""AdaptDL's TensorBoard tutorial (docs/tutorial/mnist_tensorboard.py in
petuum/adaptdl) on Pollux: step 5 of the tutorial writing the test loss and accuracy
to TensorBoard under ``$ADAPTDL_TENSORBOARD_LOGDIR/<adaptdl.env.get_job_name()>``.

Written in the tutorial's shape: what differs from it are the two import lines marked
"Pollux" and the data (scikit-learn's 8x8 digits resized to 28x28, shipped with
scikit-learn: no download, in place of torchvision's MNIST).

    ADAPTDL_TENSORBOARD_LOGDIR=tb python examples/adaptdl/mnist_tensorboard.py --epochs 3
    tensorboard --logdir tb
"""
from __future__ import print_function
import argparse
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.tensorboard import SummaryWriter # Added for tensorboard

from pollux import adaptdl  # Pollux: was `import adaptdl`
import pollux.adaptdl.torch  # Pollux: was `import adaptdl.torch`
import os # Added for tensorboard


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout2d(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0:
            print('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                epoch, batch_idx * len(data), len(train_loader.dataset),
                100. * batch_idx / len(train_loader), loss.item()))
            if args.dry_run:
                break


def test(model, device, test_loader, epoch): # Changed for tensorboard
    model.eval()
    stats = adaptdl.torch.Accumulator()
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            stats["test_loss"] += F.nll_loss(output, target, reduction='sum').item()
            pred = output.argmax(dim=1, keepdim=True)
            stats["correct"] += pred.eq(target.view_as(pred)).sum().item()

    with stats.synchronized():
        test_loss = stats["test_loss"] / len(test_loader.dataset)
        correct = stats["correct"]
        tensorboard_dir = os.path.join(os.getenv("ADAPTDL_TENSORBOARD_LOGDIR", "/tmp"),
                                       adaptdl.env.get_job_name()) # Added for tensorboard
        with SummaryWriter(tensorboard_dir) as writer: # Added for tensorboard
            writer.add_scalar("Test/Loss", test_loss, epoch) # Added for tensorboard
            writer.add_scalar("Test/Accuracy", 100. * correct / len(test_loader.dataset), epoch) # Added for tensorboard

        print('\nTest set: Average loss: {:.4f}, Accuracy: {}/{} ({:.0f}%)\n'.format(
            test_loss, correct, len(test_loader.dataset),
            100. * correct / len(test_loader.dataset)))


def digits(train):
    """The data (in place of MNIST): 1,797 scikit-learn digits, 8x8 scaled to 28x28,
    normalized like MNIST; a fixed 1,437/360 train/test split."""
    from sklearn.datasets import load_digits

    data = load_digits()
    order = torch.randperm(len(data.target), generator=torch.Generator().manual_seed(0))
    images = torch.tensor(data.images / 16.0, dtype=torch.float32)[order].unsqueeze(1)
    images = F.interpolate(images, size=(28, 28), mode='bilinear', align_corners=False)
    images = (images - 0.1307) / 0.3081
    labels = torch.tensor(data.target, dtype=torch.int64)[order]
    part = slice(360, None) if train else slice(None, 360)
    return torch.utils.data.TensorDataset(images[part], labels[part])


def main():
    # Training settings
    parser = argparse.ArgumentParser(description='PyTorch MNIST Example')
    parser.add_argument('--batch-size', type=int, default=64, metavar='N',
                        help='input batch size for training (default: 64)')
    parser.add_argument('--test-batch-size', type=int, default=1000, metavar='N',
                        help='input batch size for testing (default: 1000)')
    parser.add_argument('--epochs', type=int, default=14, metavar='N',
                        help='number of epochs to train (default: 14)')
    parser.add_argument('--lr', type=float, default=1.0, metavar='LR',
                        help='learning rate (default: 1.0)')
    parser.add_argument('--gamma', type=float, default=0.7, metavar='M',
                        help='Learning rate step gamma (default: 0.7)')
    parser.add_argument('--no-cuda', action='store_true', default=False,
                        help='disables CUDA training')
    parser.add_argument('--dry-run', action='store_true', default=False,
                        help='quickly check a single pass')
    parser.add_argument('--seed', type=int, default=1, metavar='S',
                        help='random seed (default: 1)')
    parser.add_argument('--log-interval', type=int, default=10, metavar='N',
                        help='how many batches to wait before logging training status')
    parser.add_argument('--save-model', action='store_true', default=False,
                        help='For Saving the current Model')
    args = parser.parse_args()
    use_cuda = not args.no_cuda and torch.cuda.is_available()

    torch.manual_seed(args.seed)

    device = torch.device("cuda" if use_cuda else "cpu")

    kwargs = {'batch_size': args.batch_size}
    if use_cuda:
        kwargs.update({'num_workers': 1,
                       'pin_memory': True,
                       'shuffle': True},
                      )

    dataset1 = digits(train=True)
    dataset2 = digits(train=False)
    train_loader = adaptdl.torch.AdaptiveDataLoader(dataset1, drop_last=True, **kwargs)
    test_loader = adaptdl.torch.AdaptiveDataLoader(dataset2, **kwargs)

    train_loader.autoscale_batch_size(1028, local_bsz_bounds=(32, 128))

    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)

    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    adaptdl.torch.init_process_group("nccl" if torch.cuda.is_available()
                                     else "gloo")
    model = adaptdl.torch.AdaptiveDataParallel(model, optimizer, scheduler)

    for epoch in adaptdl.torch.remaining_epochs_until(args.epochs):
        train(args, model, device, train_loader, optimizer, epoch)
        test(model, device, test_loader, epoch) # Changed for tensorboard
        scheduler.step()

    if args.save_model:
        torch.save(model.state_dict(), "mnist_cnn.pt")


if __name__ == '__main__':
    main()
